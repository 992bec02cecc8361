//! How a broker's refusal of an admin request (metadata, CreateTopics) is
//! met, and how long a creation is asked again. Below both the errors
//! (which say whether a reconnect may help) and the topic manager (which
//! asks again within a call).

use std::time::Duration;

use rdkafka::types::RDKafkaErrorCode;

/// How long the controller may take to create a topic before CreateTopics
/// answers (Kafka's own admin tools wait 30 s).
pub(super) const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a broker's refusal of a metadata or CreateTopics request is met. One
/// table answers both questions: whether to ask again within the call
/// ([`create_topic`](super::topics::create_topic)), and whether a reconnect
/// may help once the call gave up
/// ([`SinkError::is_retryable`](super::error::SinkError::is_retryable)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AdminRefusal {
    /// A controller moving or busy: asked again within the call, and a
    /// reconnect may help after it.
    Passing,
    /// INVALID_REPLICATION_FACTOR: a KRaft cluster with every broker fenced
    /// (a paused or restarted broker) answers it for a moment, a replication
    /// factor above the cluster's size for ever. Asked again within the
    /// call; after it, the user's to fix.
    PassingOrSetting,
    /// Will not change by asking again: a setting, an ACL or the topic.
    Setting,
    /// Anything else: a reconnect may help.
    Other,
}

impl AdminRefusal {
    pub(super) fn of(code: RDKafkaErrorCode) -> AdminRefusal {
        use RDKafkaErrorCode as C;
        match code {
            C::NotController
            | C::RequestTimedOut
            | C::BrokerNotAvailable
            | C::ThrottlingQuotaExceeded => AdminRefusal::Passing,
            C::InvalidReplicationFactor => AdminRefusal::PassingOrSetting,
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::InvalidTopic
            | C::InvalidPartitions
            | C::InvalidReplicaAssignment
            | C::InvalidConfig
            | C::InvalidRequest
            | C::PolicyViolation
            | C::UnsupportedVersion => AdminRefusal::Setting,
            _ => AdminRefusal::Other,
        }
    }

    /// Worth asking again within one call.
    pub(super) fn may_pass(self) -> bool {
        matches!(self, AdminRefusal::Passing | AdminRefusal::PassingOrSetting)
    }

    /// Whether a reconnect may help once the call gave up.
    pub(super) fn reconnect_may_help(self) -> bool {
        matches!(self, AdminRefusal::Passing | AdminRefusal::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_says_whether_to_ask_again_and_whether_to_reconnect() {
        use RDKafkaErrorCode as C;
        // (code, asked again within the call, a reconnect may help after it)
        for (code, ask_again, reconnect) in [
            (C::NotController, true, true),
            (C::RequestTimedOut, true, true),
            // KRaft answers a CreateTopics with every broker fenced this way.
            (C::InvalidReplicationFactor, true, false),
            (C::TopicAuthorizationFailed, false, false),
            (C::ClusterAuthorizationFailed, false, false),
            (C::InvalidTopic, false, false),
            (C::InvalidPartitions, false, false),
            (C::InvalidConfig, false, false),
            (C::PolicyViolation, false, false),
            (C::LeaderNotAvailable, false, true),
        ] {
            let refusal = AdminRefusal::of(code);
            assert_eq!(refusal.may_pass(), ask_again, "{code:?}");
            assert_eq!(refusal.reconnect_may_help(), reconnect, "{code:?}");
        }
    }
}
