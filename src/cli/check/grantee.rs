//! The principal and brokers in the grant commands `check` prints. The
//! sink's errors and the transactional-id check are written without the
//! config at hand and say `User:PRINCIPAL` and `BROKER`; `check` has it,
//! and puts in `kafka.brokers` and the principal the client's settings
//! name (`sasl.username`, `User:ANONYMOUS` on PLAINTEXT), so the command
//! can be pasted as it is.

use std::collections::BTreeMap;

use super::line::Line;
use crate::sink::probe::topic_rights::principal;

/// The placeholders the grant commands are written with.
const PLACEHOLDERS: [&str; 2] = ["User:PRINCIPAL", "User:<outboxd's principal>"];

/// The brokers' placeholder, as the commands write it.
const BROKERS: &str = "--bootstrap-server BROKER ";

/// `line` with the placeholders replaced by `brokers` and the principal
/// `properties` name (or by the one placeholder that says what to put
/// in, when they name none).
pub(super) fn named(
    mut line: Line,
    brokers: Option<&str>,
    properties: &BTreeMap<String, String>,
) -> Line {
    if let Some(brokers) = brokers {
        let given = format!("--bootstrap-server {brokers} ");
        line.detail = line.detail.replace(BROKERS, &given);
    }
    if PLACEHOLDERS.iter().any(|p| line.detail.contains(p)) {
        let who = principal(properties).name;
        for placeholder in PLACEHOLDERS {
            line.detail = line.detail.replace(placeholder, &who);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_sasl_user_replaces_the_placeholders() {
        let scram = props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "relay"),
        ]);
        let line = Line::fail(
            "topics",
            "kafka-acls.sh --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL \
             --operation Create --topic t; or --allow-principal User:<outboxd's principal>",
        );
        let detail = named(line, Some("b:9093"), &scram).detail;
        assert_eq!(
            detail,
            "kafka-acls.sh --bootstrap-server b:9093 --add --allow-principal User:relay \
             --operation Create --topic t; or --allow-principal User:relay"
        );
    }

    #[test]
    fn without_a_known_principal_one_placeholder_remains() {
        let tls = props(&[("security.protocol", "SSL")]);
        let line = Line::fail("ledger topic", "--allow-principal User:PRINCIPAL --topic l");
        assert_eq!(
            named(line, None, &tls).detail,
            "--allow-principal User:<outboxd's principal> --topic l"
        );
    }
}
