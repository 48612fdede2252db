use super::*;

fn none() -> Option<String> {
    None
}

#[test]
fn batchfleet_gpus_wins_over_cuda_visible_devices_and_nvidia_smi() {
    let listing = || Some("GPU 0: A (UUID: GPU-a)\nGPU 1: B (UUID: GPU-b)\n".to_string());
    assert_eq!(find(Some(" 2, 3 ".into()), Some("0".into()), listing), ["2", "3"]);
    assert_eq!(find(None, Some("1".into()), listing), ["1"]);
    assert_eq!(find(None, None, listing), ["0", "1"]);
}

#[test]
fn an_empty_or_none_list_means_no_gpus_even_where_nvidia_smi_lists_some() {
    let listing = || Some("GPU 0: A (UUID: GPU-a)\n".to_string());
    for empty in ["", "none", "NONE", "-1", " , "] {
        assert!(find(Some(empty.into()), None, listing).is_empty(), "{empty:?}");
    }
    assert!(find(None, None, none).is_empty());
}

#[test]
fn nvidia_smi_lines_that_name_no_gpu_are_skipped() {
    let listing = "GPU 0: NVIDIA A100 (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-1)\n\
                   No devices found\nGPU 3: T4 (UUID: GPU-3)\n";
    assert_eq!(find(None, None, || Some(listing.into())), ["0", "3"]);
}

#[test]
fn slots_get_devices_round_robin() {
    let devices: Vec<String> = ["4", "7"].map(String::from).to_vec();
    let given: Vec<_> = (0..5).map(|i| devices_for_slot(&devices, i, 5)).collect();
    let want = ["4", "7", "4", "7", "4"].map(|d| Some(d.to_string()));
    assert_eq!(given, want);
    assert_eq!(devices_for_slot(&[], 3, 5), None);
}

#[test]
fn fewer_slots_than_devices_share_them_out() {
    let devices: Vec<String> = ["0", "1", "2", "3", "4"].map(String::from).to_vec();
    assert_eq!(devices_for_slot(&devices, 0, 1).as_deref(), Some("0,1,2,3,4"), "one slot: all");
    let two: Vec<_> = (0..2).map(|i| devices_for_slot(&devices, i, 2).unwrap()).collect();
    assert_eq!(two, ["0,1", "2,3,4"]);
}
