//! The Kafka sink against the real broker: what it reports as delivered is
//! what Kafka holds.

mod fresh_topic;
mod ledger_acl;
mod ledger_topic;
