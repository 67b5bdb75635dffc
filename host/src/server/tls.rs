//! HTTPS for `--ssl-key-file` and `--ssl-cert-file` (PEM files, as llama-server reads them):
//! rustls with the ring provider (no OpenSSL, no C build beyond ring's), TLS 1.2 and 1.3, HTTP/1.1 offered by ALPN. A file that cannot
//! be read or holds no key or certificate is a named error at start.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Why the TLS files cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no PEM certificate.
    #[error("--ssl-cert-file {path}: {why}")]
    Certificate {
        /// The file.
        path: String,
        /// What was wrong.
        why: String,
    },
    /// The key file is unreadable or holds no PEM private key.
    #[error("--ssl-key-file {path}: {why}")]
    Key {
        /// The file.
        path: String,
        /// What was wrong.
        why: String,
    },
    /// rustls refused the pair (a key that does not match the certificate, say).
    #[error("--ssl-key-file {key} with --ssl-cert-file {cert}: {why}")]
    Pair {
        /// The key file.
        key: String,
        /// The certificate file.
        cert: String,
        /// rustls's reason.
        why: String,
    },
}

/// The acceptor for the key and certificate chain in these PEM files.
pub fn acceptor(key: &Path, cert: &Path) -> Result<TlsAcceptor, TlsError> {
    let cert_err = |why: String| TlsError::Certificate {
        path: cert.display().to_string(),
        why,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM certificate in the file".into()));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.display().to_string(),
        why: e.to_string(),
    })?;
    let pair_err = |why: String| TlsError::Pair {
        key: key.display().to_string(),
        cert: cert.display().to_string(),
        why,
    };
    // rustls 0.23.48 marks ring's provider deprecated for its lack of post-quantum key exchange;
    // aws-lc-rs, which has it, needs a C/CMake build of AWS-LC. X25519 and the NIST curves serve
    // every HTTPS client of an inference server.
    #[allow(deprecated)]
    let provider = Arc::new(ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| pair_err(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| pair_err(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_or_empty_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a pem file\n").unwrap();
        let missing = dir.path().join("missing.pem");
        let e = acceptor(&empty, &missing).err().unwrap().to_string();
        assert!(
            e.starts_with("--ssl-cert-file ") && e.contains("missing.pem"),
            "{e}"
        );
        let e = acceptor(&empty, &empty).err().unwrap().to_string();
        assert!(
            e.starts_with("--ssl-cert-file ") && e.contains("no PEM certificate"),
            "{e}"
        );
    }
}
