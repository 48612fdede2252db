//! Tests of the plan writer: chunks bounded in bytes, recorded before publishing, in order.

use std::time::Duration;

use super::*;
use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::message::QueueNames;

use batchfleet_common::broker::declare::declare_pool_queues;

/// A plan of `batches` batches of `items` items each, published to an embedded broker; returns
/// the chunk objects' contents and the published payloads, in order.
async fn plan_of(batches: usize, items: usize, skip: &HashSet<u64>) -> (Vec<Vec<u8>>, Vec<Bytes>) {
    let dir = tempfile::tempdir().unwrap();
    let root = JobRoot::create(&url::Url::from_directory_path(dir.path()).unwrap(), "j").unwrap();
    let broker = EmbeddedBroker::new();
    let queues = QueueNames::for_pool("test");
    declare_pool_queues(&broker, &queues).await.unwrap();
    let target = PlanTarget { skip: Some(skip), ..PlanTarget::new(&root, &broker, &queues.work) };
    let mut writer = PlanWriter::new(&target);
    for batch in 0..batches {
        let names = (0..items).map(|i| format!("folder-{batch:04}/file-{i:06}.txt")).collect();
        writer.push_files(names, &[], 0).await.unwrap();
    }
    let summary = writer.finish(&crate::test_support::minimal_job()).await.unwrap();
    assert_eq!(summary.batches, batches as u64);
    assert_eq!(summary.items, (batches * items) as u64);
    let mut chunks = Vec::new();
    for chunk_no in 0.. {
        match root.get_if_exists(&root.layout.plan_chunk(chunk_no)).await.unwrap() {
            Some(bytes) => chunks.push(bytes.to_vec()),
            None => break,
        }
    }
    let mut published = Vec::new();
    loop {
        let got = broker
            .receive(&queues.work, 1000, Duration::from_secs(60), Duration::ZERO)
            .await
            .unwrap();
        if got.is_empty() {
            break;
        }
        published.extend(got.into_iter().map(|d| d.payload));
    }
    (chunks, published)
}

#[tokio::test]
async fn chunks_stay_bounded_in_bytes_and_hold_every_batch_in_order() {
    // 300 batches of 2,000 names: about 60 KB a message, 18 MB in all.
    let (chunks, published) = plan_of(300, 2000, &HashSet::new()).await;
    assert!(chunks.len() > 4, "{} chunks", chunks.len());
    for chunk in &chunks {
        assert!(chunk.len() <= CHUNK_BYTES + CLAIM_CHECK_BYTES + 1, "{} bytes", chunk.len());
    }
    let lines: Vec<&[u8]> =
        chunks.iter().flat_map(|c| c.split(|b| *b == b'\n').filter(|l| !l.is_empty())).collect();
    assert_eq!(lines.len(), 300);
    assert_eq!(published.len(), 300);
    for (index, (line, payload)) in lines.iter().zip(&published).enumerate() {
        assert_eq!(*line, &payload[..], "the published message is the recorded one");
        let msg: MiniBatchMessage = serde_json::from_slice(line).unwrap();
        assert_eq!(msg.index, index as u64);
        assert_eq!(msg.items.len(), 2000);
        assert_eq!(msg.items[0], format!("folder-{index:04}/file-000000.txt"));
    }
}

#[tokio::test]
async fn batches_that_ended_are_recorded_not_published() {
    let skip: HashSet<u64> = [0, 5, 39].into();
    let (chunks, published) = plan_of(40, 3, &skip).await;
    assert_eq!(chunks.len(), 2, "the first chunk holds 32 batches");
    let indexes: Vec<u64> = published
        .iter()
        .map(|p| serde_json::from_slice::<MiniBatchMessage>(p).unwrap().index)
        .collect();
    let expected: Vec<u64> = (0..40).filter(|i| !skip.contains(i)).collect();
    assert_eq!(indexes, expected);
}

#[tokio::test]
async fn items_too_large_for_a_message_are_claim_checked() {
    let (chunks, published) = plan_of(2, 5000, &HashSet::new()).await;
    let msg: MiniBatchMessage = serde_json::from_slice(&published[1]).unwrap();
    assert!(msg.items.is_empty());
    assert_eq!(msg.items_ref.as_ref().map(|r| r.count), Some(5000));
    assert!(published[1].len() <= CLAIM_CHECK_BYTES);
    assert_eq!(chunks.concat().iter().filter(|b| **b == b'\n').count(), 2);
}

#[tokio::test]
async fn chunks_double_from_the_first_up_to_the_limit() {
    let (chunks, published) = plan_of(3000, 1, &HashSet::new()).await;
    let sizes: Vec<usize> =
        chunks.iter().map(|c| c.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count()).collect();
    assert_eq!(sizes, vec![32, 64, 128, 256, 512, 1000, 1000, 8]);
    assert_eq!(published.len(), 3000);
}
