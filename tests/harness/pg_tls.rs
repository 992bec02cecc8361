//! Client certificates for a TLS cluster ([`PgOptions::with_ssl`]), made
//! with the openssl CLI at test start, and the pg_hba.conf that asks for
//! them.
//!
//! [`PgOptions::with_ssl`]: super::pg::PgOptions::with_ssl

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::pg::PgCluster;

/// Who signs a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issuer {
    /// The CA the server trusts (`ssl_ca_file`).
    ServerCa,
    /// An unrelated CA: the server must refuse the certificate.
    WrongCa,
}

/// A client certificate for user `cn` and its unencrypted key (PEM), in
/// `dir`: `(cert, key)`.
pub fn client_cert(pg: &PgCluster, cn: &str, issuer: Issuer, dir: &Path) -> (PathBuf, PathBuf) {
    let ca_key = pg.ca_key_path();
    let tls_dir = ca_key.parent().expect("the CA key is in the tls dir");
    let (ca_crt, ca_key) = match issuer {
        Issuer::ServerCa => (tls_dir.join("ca.crt"), ca_key.clone()),
        Issuer::WrongCa => (tls_dir.join("wrong-ca.crt"), tls_dir.join("wrong-ca.key")),
    };
    let stem = format!("{cn}-{issuer:?}").to_lowercase();
    let key = dir.join(format!("{stem}.key"));
    let csr = dir.join(format!("{stem}.csr"));
    let crt = dir.join(format!("{stem}.crt"));
    let ext = dir.join(format!("{stem}.ext"));
    std::fs::write(
        &ext,
        "basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature\n\
         extendedKeyUsage = clientAuth\n",
    )
    .unwrap();
    openssl(
        Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr)
            .args(["-subj", &format!("/CN={cn}")]),
    );
    openssl(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "3650", "-sha256"])
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(&ca_crt)
            .arg("-CAkey")
            .arg(&ca_key)
            .arg("-set_serial")
            .arg(format!("0x{}", uuid::Uuid::new_v4().simple()))
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&crt),
    );
    (crt, key)
}

fn openssl(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().expect("run openssl");
    assert!(
        out.status.success(),
        "openssl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Turns client certificates on (`ssl_ca_file`) and writes a pg_hba.conf
/// whose first lines are `lines` (e.g. `hostssl all cert_user 127.0.0.1/32
/// cert`), then the usual scram-sha-256 lines for everyone else; restarts
/// nothing (both take effect on reload, waited for).
pub fn require_client_certs(pg: &PgCluster, lines: &[&str]) {
    let conf = pg.data_dir().join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    if !text.contains("ssl_ca_file = 'ca.crt'") {
        text.push_str("ssl_ca_file = 'ca.crt'\n");
        std::fs::write(&conf, text).unwrap();
    }
    let mut hba = String::from("local all all trust\nlocal replication all trust\n");
    for line in lines {
        hba.push_str(line);
        hba.push('\n');
    }
    hba.push_str(
        "host all all 127.0.0.1/32 scram-sha-256\n\
         host replication all 127.0.0.1/32 scram-sha-256\n",
    );
    pg.write_hba(&hba);
    // pg_ctl reload only signals: wait until new sessions see the settings
    // (pg_hba.conf is re-read in the same reload).
    super::wait::wait_for(
        "the reload of ssl_ca_file",
        std::time::Duration::from_secs(30),
        || pg.psql("postgres", "SHOW ssl_ca_file") == "ca.crt",
    );
}
