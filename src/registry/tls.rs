//! The registry client's TLS: the CA of `schema_registry.ca_file`, the
//! client certificate and key of `cert_file`/`key_file` for mutual TLS, and
//! which TLS failures are a setting to fix rather than an outage.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::registry::client::Failure;
use crate::registry::error::RegistryError;

/// A TLS error named by the setting that fixes it: the registry's
/// certificate not signed by the CA of `ca_file`, or the registry refusing
/// the client certificate (or its absence); anything else is a connection
/// that may work later.
pub(super) fn tls_failure(
    error: &(dyn std::error::Error + 'static),
    what: String,
    client_cert: bool,
) -> Failure {
    match find_rustls_error(error) {
        Some(rustls::Error::InvalidCertificate(e)) => Failure::Tls {
            key: "schema_registry.ca_file",
            reason: format!(
                "the registry's certificate is not trusted ({e:?}): schema_registry.ca_file must \
                 hold the CA that signed it, for the host name in schema_registry.url"
            ),
        },
        Some(rustls::Error::AlertReceived(alert))
            if refuses_client_certificate(*alert) && client_cert =>
        {
            Failure::Tls {
                key: "schema_registry.cert_file",
                reason: format!(
                    "the registry refused the client certificate (TLS alert {alert:?}): \
                     schema_registry.cert_file and schema_registry.key_file must name a \
                     certificate the registry's trusted CA signed, and its key"
                ),
            }
        }
        Some(rustls::Error::AlertReceived(alert)) if refuses_client_certificate(*alert) => {
            Failure::Tls {
                key: "schema_registry.cert_file",
                reason: format!(
                    "the registry wants a client certificate (TLS alert {alert:?}): set \
                     schema_registry.cert_file and schema_registry.key_file to the PEM files of \
                     a certificate its trusted CA signed and of its key"
                ),
            }
        }
        _ => Failure::Unreachable(format!("{what}: {error}")),
    }
}

/// The alerts a server sends about the client's certificate.
fn refuses_client_certificate(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
    )
}

/// The rustls error under hyper's and tokio-rustls' wrapping. An
/// `io::Error`'s `source()` skips the error it wraps, so that is looked
/// into too.
fn find_rustls_error<'a>(
    mut error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    loop {
        if let Some(e) = error.downcast_ref::<rustls::Error>() {
            return Some(e);
        }
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(e) = find_rustls_error(inner) {
                return Some(e);
            }
        }
        error = error.source()?;
    }
}

/// The TLS settings: the CAs of `ca_file`, and the client certificate and
/// key of `cert_file`/`key_file` when set. Errors never quote the key.
pub(super) fn tls_connector(
    ca_file: &Path,
    client: Option<(&Path, &Path)>,
) -> Result<TlsConnector, RegistryError> {
    let err = |key: &'static str, path: &Path, reason: String| RegistryError::Config {
        key: key.into(),
        reason: format!("{}: {reason}", path.display()),
    };
    let certs = read_certs(ca_file).map_err(|r| err("schema_registry.ca_file", ca_file, r))?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| err("schema_registry.ca_file", ca_file, e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("schema_registry.ca_file", ca_file, e.to_string()))?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert_file, key_file)) => {
            let chain = read_certs(cert_file)
                .map_err(|r| err("schema_registry.cert_file", cert_file, r))?;
            // The parser's errors say what is wrong with the file, not
            // what is in it.
            let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
                err(
                    "schema_registry.key_file",
                    key_file,
                    format!("no readable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                err(
                    "schema_registry.key_file",
                    key_file,
                    format!("does not fit schema_registry.cert_file: {e}"),
                )
            })?
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The PEM certificates of a file, at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificates in the file".into());
    }
    Ok(certs)
}
