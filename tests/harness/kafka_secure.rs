//! A Kafka broker secured as production brokers are (issue 40), started
//! once per test binary by [`secured()`]: TLS from a private CA made at
//! start (openssl, PEM files), Kafka's StandardAuthorizer with no ACL
//! allowing anything by default, and one listener per way in:
//!
//! * `SASL_SSL`: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, and OAUTHBEARER
//!   checked by the broker's unsecured-JWT validator;
//! * `SSL` with client certificates required (mutual TLS), the principal
//!   being the certificate's CN;
//! * `PLAINTEXT` for the harness itself: its principal `User:ANONYMOUS` is
//!   a super user (creates the users, grants the ACLs, reads topics back).
//!
//! Each [`Mode`] logs in as a user of its own, so that what one mode is
//! granted says nothing about another. Secrets (passwords, the client key's
//! pass phrase) are random per run and reach `outboxd` only through
//! environment variables named in its config (`${VAR}`).
#![allow(dead_code)]

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::harness::admin_ffi::admin_result;
use crate::harness::http::free_port;
use crate::harness::kafka::KafkaBroker;
use crate::harness::kafka_acl::{allow, Operation, Pattern, Resource};

/// How `outboxd` logs in to the secured broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    ScramSha256,
    ScramSha512,
    Plain,
    MutualTls,
    OAuthBearer,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::ScramSha256,
        Mode::ScramSha512,
        Mode::Plain,
        Mode::MutualTls,
        Mode::OAuthBearer,
    ];

    /// The user this mode logs in as (for mutual TLS, the client
    /// certificate's CN, which the broker's principal mapping keeps).
    pub fn user(self) -> &'static str {
        match self {
            Mode::ScramSha256 => "outboxd-scram256",
            Mode::ScramSha512 => "outboxd-scram512",
            Mode::Plain => "outboxd-plain",
            Mode::MutualTls => "outboxd-mtls",
            Mode::OAuthBearer => "outboxd-oauth",
        }
    }

    pub fn principal(self) -> String {
        format!("User:{}", self.user())
    }

    /// For names of slots and topics: lower case, no punctuation.
    pub fn tag(self) -> &'static str {
        match self {
            Mode::ScramSha256 => "scram256",
            Mode::ScramSha512 => "scram512",
            Mode::Plain => "plain",
            Mode::MutualTls => "mtls",
            Mode::OAuthBearer => "oauth",
        }
    }
}

/// The environment variable holding the password of `mode`'s user, or the
/// pass phrase of the client key.
pub const PASSWORD_VAR: &str = "OUTBOXD_TEST_KAFKA_SECRET";

/// The files of the private CA, made at start.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
    /// A CA that signed nothing the broker has.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }
    fn server_keystore(&self) -> PathBuf {
        self.dir.path().join("server-keystore.pem")
    }
    pub fn client_certificate(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }
    /// Encrypted with [`SecuredKafka::secret`]`(Mode::MutualTls)`.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// A CA, a certificate for the broker (for 127.0.0.1 only: connecting
    /// through another name fails host name verification), a client
    /// certificate for `client_cn` with its key encrypted by `passphrase`,
    /// and an unrelated CA.
    fn make(client_cn: &str, passphrase: &str) -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-pki-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let days = ["-days", "2"];
        let new_ca = |name: &str, cn: &str| {
            openssl(
                d,
                &[
                    &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"],
                    &[&format!("{name}.key"), "-out", &format!("{name}.pem")],
                    &days,
                    &["-subj", &format!("/CN={cn}")],
                ],
            )
        };
        new_ca("ca", "outboxd test CA");
        new_ca("other-ca", "another CA");
        let signed = |name: &str, cn: &str, ext: &str| {
            openssl(
                d,
                &[
                    &["req", "-newkey", "rsa:2048", "-nodes", "-keyout"],
                    &[&format!("{name}.key"), "-out", &format!("{name}.csr")],
                    &["-subj", &format!("/CN={cn}")],
                ],
            );
            std::fs::write(d.join(format!("{name}.ext")), ext).unwrap();
            openssl(
                d,
                &[
                    &["x509", "-req", "-in", &format!("{name}.csr")],
                    &["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"],
                    &["-out", &format!("{name}.pem"), "-extfile"],
                    &[&format!("{name}.ext")],
                    &days,
                ],
            );
        };
        signed(
            "server",
            "outboxd test broker",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        signed("client", client_cn, "extendedKeyUsage=clientAuth\n");
        // Kafka's PEM key store: the key (PKCS#8), then the chain.
        let keystore = [
            std::fs::read_to_string(d.join("server.key")).unwrap(),
            std::fs::read_to_string(d.join("server.pem")).unwrap(),
        ]
        .concat();
        std::fs::write(d.join("server-keystore.pem"), keystore).unwrap();
        openssl(
            d,
            &[
                &["pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", "client.key"],
                &["-out", "client.key.enc", "-passout"],
                &[&format!("pass:{passphrase}")],
            ],
        );
        std::fs::rename(d.join("client.key.enc"), d.join("client.key")).unwrap();
        Pki { dir }
    }
}

fn openssl(dir: &Path, args: &[&[&str]]) {
    let args: Vec<&str> = args.concat();
    let out = Command::new("openssl")
        .args(&args)
        .current_dir(dir)
        .output()
        .expect("cannot run openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The secured broker: [`KafkaBroker`] (its `bootstrap` is the super
/// user's PLAINTEXT listener) with the secured listeners beside it.
pub struct SecuredKafka {
    pub broker: KafkaBroker,
    pub pki: Pki,
    /// `127.0.0.1:PORT` of the SASL_SSL listener.
    pub sasl_ssl: String,
    /// `127.0.0.1:PORT` of the mutual-TLS listener.
    pub mtls: String,
    /// Per run: nothing a test prints may contain it.
    secret: String,
}

/// The broker shared by every test of this binary, started on first use
/// (about 15 s: the CA, the JVM, the users).
pub fn secured() -> &'static SecuredKafka {
    static SECURED: OnceLock<SecuredKafka> = OnceLock::new();
    SECURED.get_or_init(SecuredKafka::start)
}

impl SecuredKafka {
    fn start() -> SecuredKafka {
        let secret = format!("s3cr3t-{}", uuid::Uuid::new_v4().simple());
        let pki = Pki::make(Mode::MutualTls.user(), &secret);
        let (sasl_port, mtls_port) = (free_port(), free_port());
        let sasl_ssl = format!("127.0.0.1:{sasl_port}");
        let mtls = format!("127.0.0.1:{mtls_port}");
        let plain_users = format!(
            "user_{}=\"{secret}\"",
            Mode::Plain.user() // PLAIN checks passwords against the JAAS entries
        );
        let extra = format!(
            "listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CPORT@,\
             SASL_SSL://{sasl_ssl},SSL://{mtls}\n\
             advertised.listeners=SASL_SSL://{sasl_ssl},SSL://{mtls},PLAINTEXT://127.0.0.1:@PORT@\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,\
             SASL_SSL:SASL_SSL,SSL:SSL\n\
             authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
             allow.everyone.if.no.acl.found=false\n\
             super.users=User:ANONYMOUS\n\
             ssl.keystore.type=PEM\n\
             ssl.keystore.location={keystore}\n\
             ssl.truststore.type=PEM\n\
             ssl.truststore.location={ca}\n\
             listener.name.ssl.ssl.client.auth=required\n\
             ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT\n\
             sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER\n\
             listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=\
             org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
             listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=\
             org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
             listener.name.sasl_ssl.plain.sasl.jaas.config=\
             org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};\n\
             listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=\
             org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
             unsecuredLoginStringClaim_sub=\"broker\";\n",
            keystore = pki.server_keystore().display(),
            ca = pki.ca().display(),
        );
        let broker = KafkaBroker::start_with(&extra);
        for (mode, mechanism) in [
            (
                Mode::ScramSha256,
                rd::rd_kafka_ScramMechanism_t::RD_KAFKA_SCRAM_MECHANISM_SHA_256,
            ),
            (
                Mode::ScramSha512,
                rd::rd_kafka_ScramMechanism_t::RD_KAFKA_SCRAM_MECHANISM_SHA_512,
            ),
        ] {
            add_scram_user(broker.bootstrap(), mode.user(), mechanism, &secret);
        }
        SecuredKafka {
            broker,
            pki,
            sasl_ssl,
            mtls,
            secret,
        }
    }

    /// The password of every SASL user and the client key's pass phrase.
    /// Handed to `outboxd` only as [`PASSWORD_VAR`].
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The listener `mode` connects to.
    pub fn bootstrap(&self, mode: Mode) -> &str {
        match mode {
            Mode::MutualTls => &self.mtls,
            _ => &self.sasl_ssl,
        }
    }

    /// The `[kafka.properties]` entries (TOML lines) for `mode`; the secret
    /// as `${PASSWORD_VAR}`.
    pub fn properties(&self, mode: Mode) -> String {
        let ca = self.pki.ca();
        let mut p = vec![("ssl.ca.location", ca.display().to_string())];
        let secret = format!("${{{PASSWORD_VAR}}}");
        let sasl = |mechanism: &str| sasl_properties(mechanism, mode.user(), &secret);
        p.extend(match mode {
            Mode::ScramSha256 => sasl("SCRAM-SHA-256"),
            Mode::ScramSha512 => sasl("SCRAM-SHA-512"),
            Mode::Plain => sasl("PLAIN"),
            Mode::MutualTls => vec![
                ("security.protocol", "SSL".to_owned()),
                (
                    "ssl.certificate.location",
                    self.pki.client_certificate().display().to_string(),
                ),
                (
                    "ssl.key.location",
                    self.pki.client_key().display().to_string(),
                ),
                ("ssl.key.password", secret.clone()),
            ],
            // The mechanism's path only: librdkafka makes an unsigned token
            // for the principal and the broker's unsecured validator takes
            // it. A real OIDC provider needs sasl.oauthbearer.method=oidc and
            // its token endpoint, client id and secret instead.
            Mode::OAuthBearer => vec![
                ("security.protocol", "SASL_SSL".to_owned()),
                ("sasl.mechanisms", "OAUTHBEARER".to_owned()),
                ("enable.sasl.oauthbearer.unsecure.jwt", "true".to_owned()),
                (
                    "sasl.oauthbearer.config",
                    format!("principal={}", mode.user()),
                ),
            ],
        });
        p.iter().map(|(k, v)| format!("{k:?} = {v:?}\n")).collect()
    }

    /// Adds a SCRAM-SHA-512 user of a test module's own, with the run's
    /// secret as password (so the ACLs the module grants and takes away
    /// say nothing about the modes' users), and returns its
    /// `[kafka.properties]` entries, as [`properties`](Self::properties).
    /// Its principal is `User:<user>`; it has no right until granted.
    pub fn add_scram_sha_512_user(&self, user: &str) -> String {
        add_scram_user(
            self.broker.bootstrap(),
            user,
            rd::rd_kafka_ScramMechanism_t::RD_KAFKA_SCRAM_MECHANISM_SHA_512,
            &self.secret,
        );
        let mut p = vec![("ssl.ca.location", self.pki.ca().display().to_string())];
        p.extend(sasl_properties(
            "SCRAM-SHA-512",
            user,
            &format!("${{{PASSWORD_VAR}}}"),
        ));
        p.iter().map(|(k, v)| format!("{k:?} = {v:?}\n")).collect()
    }

    /// The environment `outboxd` needs for `mode`'s [`properties`](Self::properties).
    pub fn env(&self) -> [(&'static str, &str); 1] {
        [(PASSWORD_VAR, self.secret())]
    }
}

/// The SASL_SSL login entries of `user` for `mechanism`.
fn sasl_properties(mechanism: &str, user: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SASL_SSL".to_owned()),
        ("sasl.mechanisms", mechanism.to_owned()),
        ("sasl.username", user.to_owned()),
        ("sasl.password", password.to_owned()),
    ]
}

/// What a relay may touch, and so what its principal is granted.
pub struct RelayResources<'a> {
    /// Every outbox topic starts with it (`PREFIXED` pattern).
    pub topic_prefix: &'a str,
    pub ledger_topic: &'a str,
    /// In exactly-once (granted as a prefix).
    pub transactional_id: Option<&'a str>,
}

/// The least privilege a relay needs (docs/operations.md, "ACLs"): WRITE
/// and DESCRIBE on its outbox topics, READ, WRITE, DESCRIBE and
/// DESCRIBE_CONFIGS on its ledger topic, CREATE on both (it creates them),
/// and in exactly-once WRITE and DESCRIBE on the transactional ids its
/// transactional id begins (prefixed: `check` probes with `<id>.check`).
/// No consumer group, nothing on the cluster.
pub fn grant_relay_least_privilege(kafka: &SecuredKafka, principal: &str, r: &RelayResources<'_>) {
    use Operation::*;
    let admin = kafka.broker.bootstrap();
    let topic = Resource::RD_KAFKA_RESOURCE_TOPIC;
    let prefixed = Pattern::RD_KAFKA_RESOURCE_PATTERN_PREFIXED;
    let literal = Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL;
    for op in [
        RD_KAFKA_ACL_OPERATION_WRITE,
        RD_KAFKA_ACL_OPERATION_DESCRIBE,
        RD_KAFKA_ACL_OPERATION_CREATE,
    ] {
        allow(admin, principal, topic, r.topic_prefix, prefixed, op);
    }
    for op in [
        RD_KAFKA_ACL_OPERATION_READ,
        RD_KAFKA_ACL_OPERATION_WRITE,
        RD_KAFKA_ACL_OPERATION_DESCRIBE,
        RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        RD_KAFKA_ACL_OPERATION_CREATE,
    ] {
        allow(admin, principal, topic, r.ledger_topic, literal, op);
    }
    if let Some(id) = r.transactional_id {
        for op in [
            RD_KAFKA_ACL_OPERATION_WRITE,
            RD_KAFKA_ACL_OPERATION_DESCRIBE,
        ] {
            allow(
                admin,
                principal,
                Resource::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
                id,
                prefixed,
                op,
            );
        }
    }
}

/// Adds (or replaces) `user`'s SCRAM credential for `mechanism`, through
/// librdkafka's AlterUserScramCredentials (rust-rdkafka wraps no call for
/// it), as the super user.
fn add_scram_user(
    bootstrap: &str,
    user: &str,
    mechanism: rd::rd_kafka_ScramMechanism_t,
    password: &str,
) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let user = CString::new(user).unwrap();
    let rk = admin.inner().native_ptr();
    // SAFETY: every pointer handed to librdkafka is valid for the call (the
    // CString and the password outlive it, `rk` lives as long as `admin`);
    // the alteration, queue and event are destroyed once each after their
    // last use; the result's array belongs to the event and is read before
    // it is destroyed. A null salt asks librdkafka for a random one.
    let outcome = unsafe {
        let mut alteration = rd::rd_kafka_UserScramCredentialUpsertion_new(
            user.as_ptr(),
            mechanism,
            4096,
            password.as_ptr(),
            password.len(),
            std::ptr::null(),
            0,
        );
        let outcome = admin_result(
            rk,
            "AlterUserScramCredentials",
            30_000,
            |queue| {
                rd::rd_kafka_AlterUserScramCredentials(
                    rk,
                    &mut alteration,
                    1,
                    std::ptr::null(),
                    queue,
                )
            },
            |event| {
                let result = rd::rd_kafka_event_AlterUserScramCredentials_result(event);
                let mut n = 0;
                let responses =
                    rd::rd_kafka_AlterUserScramCredentials_result_responses(result, &mut n);
                (0..n)
                    .map(|i| {
                        rd::rd_kafka_AlterUserScramCredentials_result_response_error(
                            *responses.add(i),
                        )
                    })
                    // A response carries an error object even on success.
                    .find(|e| {
                        !e.is_null()
                            && rd::rd_kafka_error_code(*e)
                                != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    })
                    .map_or(Ok(()), |e| {
                        Err(
                            CStr::from_ptr(rd::rd_kafka_error_string(e) as *const c_char)
                                .to_string_lossy()
                                .into_owned(),
                        )
                    })
            },
        );
        rd::rd_kafka_UserScramCredentialAlteration_destroy(alteration);
        outcome
    };
    outcome.unwrap_or_else(|e| panic!("AlterUserScramCredentials: {e}"));
}
