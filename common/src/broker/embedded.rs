//! In-process broker with the same semantics as the real ones.
