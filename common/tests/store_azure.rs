//! The store conformance suite on Azure Blob Storage's emulator, Azurite, over HTTP (started by
//! `infra/test-services`, which writes the emulator's settings the test command sources:
//! `AZURE_STORAGE_USE_EMULATOR`, `AZURITE_BLOB_STORAGE_URL` and the test container's name).

batchfleet_common::store_conformance_tests!(async {
    batchfleet_common::store::conformance::fresh_location("az", "BATCHFLEET_TEST_AZURE_CONTAINER")
});
