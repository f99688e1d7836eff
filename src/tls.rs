//! TLS with rustls: the listener's certificate (reloaded when its files
//! change, so cert-manager renewals need no restart) and the trust roots for
//! https upstreams.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Where the listener's certificate chain and key live (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A TLS problem: names files, never key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("certificate and key do not form a usable pair: {0}")]
    Pair(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// The gate's TLS primitives: *ring*'s. rustls 0.23.48 deprecated this
/// provider because it offers no post-quantum key exchange (X25519MLKEM768
/// is aws-lc-rs's only). The tree builds rustls, hyper-rustls, tokio-rustls
/// and rcgen on *ring* and nothing on aws-lc-rs, whose C build every
/// profile and the static musl image would add; moving is a change of its
/// own. Until then the warning is allowed here, in the one place that names
/// the provider.
#[allow(deprecated)]
pub fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn load(files: &TlsFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_error(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(&files.cert, e))?;
    if chain.is_empty() {
        return Err(file_error(&files.cert, "no certificate in the file"));
    }
    // The key's parse error is reported by kind only: it may quote the file.
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|_| file_error(&files.key, "no readable PEM private key"))?;
    let provider = provider();
    let certified =
        CertifiedKey::from_der(chain, key, &provider).map_err(|e| TlsError::Pair(e.to_string()))?;
    Ok(Arc::new(certified))
}

fn modified(files: &TlsFiles) -> Stamp {
    let at = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((at(&files.cert)?, at(&files.key)?))
}

/// When the certificate and key files were last modified.
type Stamp = Option<(SystemTime, SystemTime)>;

/// The listener's certificate, swapped in place when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    files: TlsFiles,
    current: RwLock<(Arc<CertifiedKey>, Stamp)>,
}

impl ReloadingCert {
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let stamp = modified(&files);
        let key = load(&files)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((key, stamp)),
        }))
    }

    /// Reloads when either file's modification time moved. A pair that does
    /// not load keeps the old one serving (and says why).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamp = modified(&self.files);
        let unchanged = self.current.read().unwrap_or_else(|p| p.into_inner()).1 == stamp;
        if unchanged {
            return Ok(false);
        }
        let key = load(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (key, stamp);
        Ok(true)
    }

    pub fn acceptor(self: &Arc<Self>) -> TlsAcceptor {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|p| p.into_inner()).0,
        ))
    }
}

/// Trust roots for https upstreams: the system's, plus `ca_file` if set.
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped: a private CA in `ca_file`
    // may be all the upstream needs.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| file_error(path, e))?;
        for cert in certs {
            roots
                .add(cert.map_err(|e| file_error(path, e))?)
                .map_err(|e| file_error(path, e))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
