//! The behaviour suite every `Broker` backend runs.
