//! The store conformance suite on a real S3-compatible server over HTTP (started by
//! `infra/test-services`, which writes the endpoint and credentials the test command sources).

batchfleet_common::store_conformance_tests!(async {
    batchfleet_common::store::conformance::fresh_location("s3", "BATCHFLEET_TEST_S3_BUCKET")
});
