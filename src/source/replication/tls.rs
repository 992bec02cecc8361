//! TLS for both PostgreSQL connections, with libpq's `sslmode` semantics.
//!
//! `prefer` and `require` encrypt without verifying the server (as libpq does
//! when no root certificate is configured); `verify-ca` checks the chain
//! against `sslrootcert`; `verify-full` also checks the host name.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::config::conn_params::{ConnParams, SslMode};

#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error(
        "sslmode={mode} needs a CA certificate: add sslrootcert=/path/to/ca.pem to postgres.url"
    )]
    MissingRootCert { mode: &'static str },
    #[error("cannot read sslrootcert {path}: {reason}")]
    RootCert { path: String, reason: String },
    /// The reason never quotes the file: it may be the private key.
    #[error("cannot use the client certificate (sslcert={cert}, sslkey={key} in postgres.url): {reason}")]
    ClientCert {
        cert: String,
        key: String,
        reason: String,
    },
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS verifier setup failed: {0}")]
    Verifier(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client config for `params`, or `None` for `sslmode=disable`.
pub(crate) fn client_config(
    params: &ConnParams,
) -> Result<Option<Arc<ClientConfig>>, TlsConfigError> {
    let builder =
        ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let verifier: Arc<dyn ServerCertVerifier> = match params.sslmode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => Arc::new(AcceptAnyServer(provider())),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let mode = if params.sslmode == SslMode::VerifyCa {
                "verify-ca"
            } else {
                "verify-full"
            };
            let path = params
                .sslrootcert
                .as_deref()
                .ok_or(TlsConfigError::MissingRootCert { mode })?;
            let webpki = WebPkiServerVerifier::builder_with_provider(
                Arc::new(load_roots(path)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsConfigError::Verifier(e.to_string()))?;
            if params.sslmode == SslMode::VerifyCa {
                Arc::new(ChainOnly(webpki))
            } else {
                webpki
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&params.sslcert, &params.sslkey) {
        (Some(cert), Some(key)) => {
            let (chain, private) = load_client_identity(cert, key)?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| client_cert_err(cert, key, e.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(Arc::new(config)))
}

/// Why a certificate was refused, when `err` or an error in its source
/// chain is a rustls certificate error (the server's certificate) or a
/// server's alert refusing ours; with what to fix.
///
/// Under TLS 1.3 the server judges the client certificate after the client
/// has finished its handshake, so its alert surfaces at the first read.
///
/// `io::Error::source` skips the error it wraps, so each io::Error in the
/// chain is opened with `get_ref` as well.
pub(crate) fn certificate_problem(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(e) = next {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        for candidate in [Some(e), inner].into_iter().flatten() {
            match candidate.downcast_ref() {
                Some(rustls::Error::InvalidCertificate(c)) => {
                    return Some(describe_certificate_error(c))
                }
                Some(rustls::Error::AlertReceived(alert)) if refuses_client_cert(*alert) => {
                    return Some(format!(
                        "the server refused this client's certificate (TLS alert {alert:?}): check sslcert \
                         and sslkey in postgres.url, and that the server's ssl_ca_file holds the CA that signed it"
                    ))
                }
                _ => {}
            }
        }
        next = e.source();
    }
    None
}

/// Alerts a server sends when it does not accept the client certificate.
fn refuses_client_cert(alert: rustls::AlertDescription) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        alert,
        A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::CertificateRequired
    )
}

fn describe_certificate_error(e: &CertificateError) -> String {
    let what = match e {
        CertificateError::UnknownIssuer => {
            "unknown issuer: it is not signed by a CA in sslrootcert; point sslrootcert in postgres.url \
             at the CA that signed the server's certificate"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "name mismatch: it is not issued for the host in postgres.url; connect by a name the \
             certificate lists, or use sslmode=verify-ca"
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "it has expired: renew the server's certificate (or check this machine's clock)"
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "it is not valid yet: check this machine's clock, or the certificate's start date"
        }
        CertificateError::Revoked => "it is revoked: the server needs a new certificate",
        _ => "check the server's certificate and sslrootcert in postgres.url",
    };
    format!("the server's certificate was refused ({e:?}): {what}")
}

/// The name rustls should check; an IP literal becomes an IP server name.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, TlsConfigError> {
    ServerName::try_from(host.to_string())
        .map_err(|e| TlsConfigError::Verifier(format!("host {host:?}: {e}")))
}

fn client_cert_err(cert: &Path, key: &Path, reason: String) -> TlsConfigError {
    TlsConfigError::ClientCert {
        cert: cert.display().to_string(),
        key: key.display().to_string(),
        reason,
    }
}

/// The client certificate chain and its key, read at each connect so a
/// renewed certificate is used from the next reconnect on.
fn load_client_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsConfigError> {
    let err = |reason: String| client_cert_err(cert, key, reason);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| err(format!("sslcert: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(format!("sslcert: {e}")))?;
    if chain.is_empty() {
        return Err(err("sslcert holds no PEM certificate".into()));
    }
    // Only the kind of failure is reported: pem errors never echo the
    // file's bytes, and nothing else of the key is put in the message.
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        err(format!(
            "sslkey: {} (an unencrypted PEM key is needed: PKCS#8, PKCS#1 or SEC1)",
            pem_error_kind(&e)
        ))
    })?;
    Ok((chain, private))
}

fn pem_error_kind(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as Pem;
    match e {
        Pem::Io(io) => io.to_string(),
        Pem::NoItemsFound => "no private key found in the file".into(),
        Pem::MissingSectionEnd { .. } | Pem::IllegalSectionStart { .. } => {
            "the PEM framing is broken".into()
        }
        Pem::Base64Decode(_) => "the PEM body is not valid base64".into(),
        _ => "not a readable PEM key".into(),
    }
}

fn load_roots(path: &Path) -> Result<RootCertStore, TlsConfigError> {
    let err = |reason: String| TlsConfigError::RootCert {
        path: path.display().to_string(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificates in file".into()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| err(e.to_string()))?;
    }
    Ok(roots)
}

/// `sslmode=prefer|require`: encryption without authentication of the server.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to `sslrootcert`, any host name.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_certificate_problem_inside_io_errors() {
        let rustls = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls);
        let text = certificate_problem(&io).expect("found");
        assert!(
            text.contains("unknown issuer") && text.contains("sslrootcert"),
            "{text}"
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(certificate_problem(&plain), None);
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        let text = certificate_problem(&io).expect("found");
        assert!(
            text.contains("UnknownCA") && text.contains("sslcert"),
            "{text}"
        );
    }

    #[test]
    fn a_broken_key_is_named_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("client.key");
        let cert = dir.path().join("client.crt");
        // The line after a broken section start is what pem errors quote.
        std::fs::write(&key, "-----BEGIN PRIVATE KEY\nS3CRET-KEY-MATERIAL\n").unwrap();
        std::fs::write(&cert, include_str!("channel_binding_test_cert.pem")).unwrap();
        let err = load_client_identity(&cert, &key).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("sslkey") && text.contains("client.key"),
            "{text}"
        );
        assert!(!text.contains("S3CRET"), "{text}");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nS3CRET!!!\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let text = load_client_identity(&cert, &key)
            .expect_err("refused")
            .to_string();
        assert!(!text.contains("S3CRET"), "{text}");
    }
}
