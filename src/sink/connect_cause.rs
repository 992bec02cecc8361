//! Why a connection to a broker failed, told from librdkafka's error texts:
//! which setting the operator has to fix.
//!
//! librdkafka reports a broker it cannot talk to as a transport failure
//! ("1/1 brokers are down", "Broker transport failure"), whatever the reason;
//! the reason is only in the text of the broker thread's `FAIL` log line and
//! error event ("SASL authentication error: …", "SSL handshake failed: …").
//! [`ConnectCause::classify`] reads those texts; it is pure so that it can
//! be tested against the texts librdkafka 2.x writes. None of them carries a
//! secret (librdkafka never echoes a password or a key), and the explanation
//! names settings, never their values.

use std::fmt;

/// What stopped a client from getting a working broker connection, most
/// specific first (see [`ConnectCause::most_specific`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConnectCause {
    /// The listener does not offer the SASL mechanism asked for.
    MechanismRefused,
    /// The broker rejected the user name and password (or the token).
    Credentials,
    /// The broker refused the client's certificate, or wanted one.
    ClientCertificate,
    /// The broker's certificate names another host than the one connected to.
    HostName,
    /// The broker's certificate has expired (or is not valid yet).
    CertificateExpired,
    /// The broker's certificate is not signed by a CA the client trusts.
    UnknownCa,
    /// The certificate check failed and the text does not say why (OpenSSL
    /// 3 says "certificate verify failed" for every reason; `check` asks
    /// again with a verification callback that sees OpenSSL's result).
    CertificateUnverified,
    /// The client speaks another protocol than the listener (TLS to a
    /// PLAINTEXT port, PLAINTEXT or SASL to a TLS port).
    Protocol,
    /// The broker closed the connection at the client's first request (the
    /// API versions): what a TLS listener does to a PLAINTEXT client. Not
    /// certain: a broker shutting down does it too.
    ClosedAtFirstRequest,
    /// No TCP connection at all: refused, unresolvable, timed out.
    Unreachable,
}

impl ConnectCause {
    /// The cause one librdkafka error text gives, if it gives one.
    pub fn classify(text: &str) -> Option<ConnectCause> {
        let t = text.to_ascii_lowercase();
        let has = |needle: &str| t.contains(needle);
        if has("unsupported sasl mechanism")
            || has("mechanism handshake failed")
            || has("no worthy mechs")
        {
            Some(ConnectCause::MechanismRefused)
        } else if has("sasl authentication error")
            || has("authentication failed")
            || has("invalid credentials")
            || has("invalid username or password")
        {
            Some(ConnectCause::Credentials)
        } else if has("hostname mismatch") || has("host name mismatch") {
            Some(ConnectCause::HostName)
        } else if has("certificate has expired") || has("certificate is not yet valid") {
            Some(ConnectCause::CertificateExpired)
        } else if has("unable to get local issuer certificate")
            || has("self-signed certificate")
            || has("self signed certificate")
            || has("unable to get issuer certificate")
        {
            Some(ConnectCause::UnknownCa)
        } else if has("certificate verify failed") || has("failed to verify broker certificate") {
            Some(ConnectCause::CertificateUnverified)
        } else if has("alert bad certificate")
            || has("alert certificate required")
            || has("alert unknown ca")
            || has("alert certificate unknown")
            || has("alert certificate expired")
            || has("client ssl authentication might be required")
        {
            Some(ConnectCause::ClientCertificate)
        } else if has("connecting to a plaintext broker listener")
            || has("incorrect security.protocol")
            || has("verify that security.protocol")
            || has("wrong version number")
            || has("packet length too long")
            || has("record layer failure")
        {
            Some(ConnectCause::Protocol)
        } else if has("disconnected") && has("in state apiversion_query") {
            Some(ConnectCause::ClosedAtFirstRequest)
        } else if has("connection refused")
            || has("failed to resolve")
            || has("connection timed out")
            || has("no route to host")
            || has("network is unreachable")
            || (has("connect to ") && has(" failed"))
        {
            Some(ConnectCause::Unreachable)
        } else {
            None
        }
    }

    /// The cause OpenSSL's certificate verification result (`X509_V_ERR_*`)
    /// names, if it names one of ours.
    pub fn from_x509_error(code: i32) -> Option<ConnectCause> {
        match code {
            // CERT_NOT_YET_VALID, CERT_HAS_EXPIRED
            9 | 10 => Some(ConnectCause::CertificateExpired),
            // HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH
            62 | 64 => Some(ConnectCause::HostName),
            // UNABLE_TO_GET_ISSUER_CERT, DEPTH_ZERO_SELF_SIGNED_CERT,
            // SELF_SIGNED_CERT_IN_CHAIN, UNABLE_TO_GET_ISSUER_CERT_LOCALLY,
            // UNABLE_TO_VERIFY_LEAF_SIGNATURE
            2 | 18 | 19 | 20 | 21 => Some(ConnectCause::UnknownCa),
            _ => None,
        }
    }

    /// The most specific cause among several texts (a failed login also
    /// brings "all brokers are down" lines; a refusal says more than them).
    pub fn most_specific<'t>(texts: impl IntoIterator<Item = &'t str>) -> Option<ConnectCause> {
        texts.into_iter().filter_map(ConnectCause::classify).min()
    }

    /// The broker turned the client away: retrying does not help until a
    /// setting changes. An unreachable broker may just not be up yet, and
    /// one that closes connections may be shutting down.
    pub fn is_refusal(self) -> bool {
        !matches!(
            self,
            ConnectCause::Unreachable | ConnectCause::ClosedAtFirstRequest
        )
    }

    /// The settings to fix.
    pub fn settings(self) -> &'static str {
        match self {
            ConnectCause::MechanismRefused => "sasl.mechanisms",
            ConnectCause::Credentials => "sasl.username / sasl.password",
            ConnectCause::ClientCertificate => "ssl.certificate.location / ssl.key.location",
            ConnectCause::HostName => {
                "the address in kafka.brokers, or ssl.endpoint.identification.algorithm"
            }
            ConnectCause::CertificateExpired => "the broker's certificate",
            ConnectCause::UnknownCa => "ssl.ca.location",
            ConnectCause::CertificateUnverified => {
                "ssl.ca.location, or the address in kafka.brokers"
            }
            ConnectCause::Protocol | ConnectCause::ClosedAtFirstRequest => "security.protocol",
            ConnectCause::Unreachable => "kafka.brokers",
        }
    }

    fn what(self) -> &'static str {
        match self {
            ConnectCause::MechanismRefused => {
                "the broker's listener does not offer this SASL mechanism"
            }
            ConnectCause::Credentials => {
                "SASL authentication failed: the broker rejected the credentials"
            }
            ConnectCause::ClientCertificate => {
                "TLS: the broker refused the client certificate (or wants one and got none)"
            }
            ConnectCause::HostName => {
                "TLS: the broker's certificate does not name the host connected to"
            }
            ConnectCause::CertificateExpired => {
                "TLS: the broker's certificate has expired or is not valid yet"
            }
            ConnectCause::UnknownCa => {
                "TLS: the broker's certificate is not signed by a CA the client trusts"
            }
            ConnectCause::CertificateUnverified => {
                "TLS: the broker's certificate could not be verified (an unknown CA or another \
                 host name)"
            }
            ConnectCause::Protocol => {
                "the broker's listener speaks another security protocol than the client"
            }
            ConnectCause::ClosedAtFirstRequest => {
                "the broker closed every connection at the client's first request, as a TLS or \
                 SASL listener does to a PLAINTEXT client"
            }
            ConnectCause::Unreachable => "no TCP connection to the broker",
        }
    }
}

impl fmt::Display for ConnectCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; check {}", self.what(), self.settings())
    }
}

/// A librdkafka error text without its variable parts: the thread prefix
/// (`[thrd:…]: host:port/id: `) and the `(after 12ms in state X)` suffix, so
/// that repeats compare equal and lines stay short.
pub fn trim_librdkafka_text(text: &str) -> &str {
    let text = text
        .strip_prefix("[thrd:")
        .and_then(|rest| rest.split_once("]: "))
        .map_or(text, |(_, rest)| rest);
    // "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: …"
    let text = match text.split_once(": ") {
        Some((who, rest)) if who.contains('/') && !who.contains(' ') => rest,
        _ => text,
    };
    text.rsplit_once(" (after ")
        .filter(|(_, tail)| tail.ends_with(')'))
        .map_or(text, |(head, _)| head)
}

#[cfg(test)]
mod tests {
    use super::ConnectCause::*;
    use super::*;

    // Texts as librdkafka 2.12 writes them (its FAIL log lines and error
    // events), from brokers of Kafka 4.x.
    const WRONG_SCRAM: &str = "[thrd:sasl_ssl://127.0.0.1:39301/bootstrap]: \
        sasl_ssl://127.0.0.1:39301/bootstrap: SASL authentication error: Authentication failed \
        during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 \
        (after 387ms in state AUTH_REQ)";
    const WRONG_PLAIN: &str = "sasl_ssl://127.0.0.1:39301/bootstrap: SASL authentication \
        error: Authentication failed: Invalid username or password (after 319ms in state AUTH_REQ)";
    const UNKNOWN_CA: &str = "sasl_ssl://127.0.0.1:39301/bootstrap: SSL handshake failed: \
        error:0A000086:SSL routines::certificate verify failed: broker certificate could not be \
        verified, verify that ssl.ca.location is correctly configured or root CA certificates \
        are installed (install ca-certificates package) (after 126ms in state SSL_HANDSHAKE)";
    const NO_CLIENT_CERT: &str = "ssl://127.0.0.1:39302/bootstrap: Receive failed: \
        error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL alert number 42 (after \
        7ms in state APIVERSION_QUERY)";
    const REFUSED: &str = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: \
        Connection refused (after 0ms in state CONNECT)";
    const MECHANISM: &str = "sasl_ssl://127.0.0.1:9093/bootstrap: SASL SCRAM-SHA-256 mechanism \
        handshake failed: Broker: Unsupported SASL mechanism: broker's supported mechanisms: PLAIN";
    const TLS_TO_PLAINTEXT: &str = "127.0.0.1:9092/bootstrap: SSL handshake failed: \
        Disconnected: connecting to a PLAINTEXT broker listener? (after 2ms in state SSL_HANDSHAKE)";
    const PLAINTEXT_TO_TLS: &str = "127.0.0.1:9093/bootstrap: Disconnected while requesting \
        ApiVersion: might be caused by incorrect security.protocol configuration (connecting to \
        a SSL listener?) or broker version is < 0.10 (see api.version.request) (after 3ms in \
        state APIVERSION_QUERY)";
    const PLAINTEXT_TO_SASL_SSL: &str = "[thrd:127.0.0.1:39301/bootstrap]: \
        127.0.0.1:39301/bootstrap: Disconnected: connection closed by peer: receive 0 after \
        POLLIN (after 4ms in state APIVERSION_QUERY)";
    const ALL_DOWN: &str = "1/1 brokers are down";

    #[test]
    fn each_text_names_its_cause() {
        assert_eq!(ConnectCause::classify(WRONG_SCRAM), Some(Credentials));
        assert_eq!(ConnectCause::classify(WRONG_PLAIN), Some(Credentials));
        assert_eq!(
            ConnectCause::classify(UNKNOWN_CA),
            Some(CertificateUnverified)
        );
        assert_eq!(
            ConnectCause::classify(NO_CLIENT_CERT),
            Some(ClientCertificate)
        );
        assert_eq!(ConnectCause::classify(REFUSED), Some(Unreachable));
        assert_eq!(ConnectCause::classify(MECHANISM), Some(MechanismRefused));
        assert_eq!(ConnectCause::classify(TLS_TO_PLAINTEXT), Some(Protocol));
        assert_eq!(ConnectCause::classify(PLAINTEXT_TO_TLS), Some(Protocol));
        assert_eq!(
            ConnectCause::classify(PLAINTEXT_TO_SASL_SSL),
            Some(ClosedAtFirstRequest)
        );
        assert_eq!(ConnectCause::classify(ALL_DOWN), None);
        assert_eq!(
            ConnectCause::classify("Failed to verify broker certificate: hostname mismatch"),
            Some(HostName)
        );
        assert_eq!(
            ConnectCause::classify("Failed to verify broker certificate: certificate has expired"),
            Some(CertificateExpired)
        );
        assert_eq!(
            ConnectCause::classify(
                "Failed to verify broker certificate: unable to get local issuer certificate"
            ),
            Some(UnknownCa)
        );
    }

    #[test]
    fn openssl_verification_results_name_the_certificate_cause() {
        assert_eq!(ConnectCause::from_x509_error(10), Some(CertificateExpired));
        assert_eq!(ConnectCause::from_x509_error(9), Some(CertificateExpired));
        assert_eq!(ConnectCause::from_x509_error(62), Some(HostName));
        assert_eq!(ConnectCause::from_x509_error(64), Some(HostName));
        assert_eq!(ConnectCause::from_x509_error(20), Some(UnknownCa));
        assert_eq!(ConnectCause::from_x509_error(19), Some(UnknownCa));
        assert_eq!(ConnectCause::from_x509_error(0), None);
        // CERT_REVOKED: none of ours, the generic text stays.
        assert_eq!(ConnectCause::from_x509_error(23), None);
    }

    #[test]
    fn a_refusal_outranks_the_transport_lines_around_it() {
        assert_eq!(
            ConnectCause::most_specific([ALL_DOWN, REFUSED, WRONG_SCRAM, REFUSED]),
            Some(Credentials)
        );
        assert_eq!(
            ConnectCause::most_specific([ALL_DOWN, REFUSED]),
            Some(Unreachable)
        );
        assert_eq!(ConnectCause::most_specific([ALL_DOWN]), None);
        assert!(!Unreachable.is_refusal());
        assert!(!ClosedAtFirstRequest.is_refusal());
        assert!(Credentials.is_refusal());
    }

    #[test]
    fn each_cause_names_a_setting() {
        for (cause, setting) in [
            (MechanismRefused, "sasl.mechanisms"),
            (Credentials, "sasl.password"),
            (ClientCertificate, "ssl.key.location"),
            (HostName, "ssl.endpoint.identification.algorithm"),
            (UnknownCa, "ssl.ca.location"),
            (Protocol, "security.protocol"),
            (ClosedAtFirstRequest, "security.protocol"),
            (Unreachable, "kafka.brokers"),
        ] {
            assert!(cause.to_string().contains(setting), "{cause}");
        }
    }

    #[test]
    fn trimming_drops_the_thread_the_broker_and_the_timing() {
        assert_eq!(
            trim_librdkafka_text(WRONG_PLAIN),
            "SASL authentication error: Authentication failed: Invalid username or password"
        );
        assert_eq!(
            trim_librdkafka_text(REFUSED),
            "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
        );
        assert_eq!(trim_librdkafka_text(ALL_DOWN), ALL_DOWN);
    }
}
