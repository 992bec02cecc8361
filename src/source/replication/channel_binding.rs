//! The `tls-server-end-point` channel binding (RFC 5929 §4.1) that SCRAM-SHA-256-PLUS
//! signs: a hash of the server's certificate as this client received it. A
//! man in the middle terminating TLS with another certificate yields another
//! hash, and the server refuses the login.

use ring::digest;
use rustls::pki_types::CertificateDer;
use x509_cert::der::Decode;
use x509_cert::spki::ObjectIdentifier;
use x509_cert::Certificate;

/// Signature algorithms whose hash is SHA-256. RFC 5929 upgrades MD5 and
/// SHA-1 to SHA-256, as PostgreSQL does on its side.
const SHA256_FAMILY: [ObjectIdentifier; 5] = [
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.4"), // md5WithRSAEncryption
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.5"), // sha1WithRSAEncryption
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11"), // sha256WithRSAEncryption
    ObjectIdentifier::new_unwrap("1.2.840.10045.4.1"),    // ecdsa-with-SHA1
    ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2"),  // ecdsa-with-SHA256
];
const SHA384_FAMILY: [ObjectIdentifier; 2] = [
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12"), // sha384WithRSAEncryption
    ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3"),   // ecdsa-with-SHA384
];
const SHA512_FAMILY: [ObjectIdentifier; 2] = [
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.13"), // sha512WithRSAEncryption
    ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.4"),   // ecdsa-with-SHA512
];

/// Why no binding can be computed for a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndPointError {
    #[error("the server's certificate cannot be parsed: {0}")]
    Unparsable(String),
    /// Ed25519, RSA-PSS and others name no single hash; PostgreSQL itself
    /// cannot bind to such a certificate either.
    #[error(
        "the server's certificate is signed with algorithm {0}, for which tls-server-end-point \
         defines no hash (PostgreSQL binds only RSA or ECDSA certificates with MD5, SHA-1 or SHA-2)"
    )]
    UnsupportedAlgorithm(String),
}

/// The `tls-server-end-point` data for the server's end-entity certificate.
pub(crate) fn server_end_point(cert: &CertificateDer<'_>) -> Result<Vec<u8>, EndPointError> {
    let parsed = Certificate::from_der(cert.as_ref())
        .map_err(|e| EndPointError::Unparsable(e.to_string()))?;
    let oid = parsed.signature_algorithm.oid;
    let algorithm = if SHA256_FAMILY.contains(&oid) {
        &digest::SHA256
    } else if SHA384_FAMILY.contains(&oid) {
        &digest::SHA384
    } else if SHA512_FAMILY.contains(&oid) {
        &digest::SHA512
    } else {
        return Err(EndPointError::UnsupportedAlgorithm(oid.to_string()));
    };
    Ok(digest::digest(algorithm, cert.as_ref()).as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed ECDSA P-256 / SHA-256 certificate (made with
    /// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -sha256`);
    /// its key was thrown away.
    const ECDSA_SHA256_PEM: &str = include_str!("channel_binding_test_cert.pem");

    fn der(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn ecdsa_sha256_certificate_hashes_with_sha256() {
        let hash = server_end_point(&der(ECDSA_SHA256_PEM)).unwrap();
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        // `openssl x509 -outform DER | sha256sum` of the same file.
        assert_eq!(
            hex,
            "06a92188c8079960fb1345b2dbab7a19b7b8b45599e7479666cc646d8f8cd6f1"
        );
    }

    #[test]
    fn ed25519_names_the_limit() {
        let pem = include_str!("channel_binding_test_ed25519.pem");
        let err = server_end_point(&der(pem)).unwrap_err();
        assert_eq!(
            err,
            EndPointError::UnsupportedAlgorithm("1.3.101.112".into())
        );
        assert!(err.to_string().contains("tls-server-end-point"), "{err}");
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let err = server_end_point(&CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])).unwrap_err();
        assert!(matches!(err, EndPointError::Unparsable(_)), "{err:?}");
    }
}
