//! TLS for the strict connection: rustls over any futures-io stream
//! (futures-rustls), with the CA file given or the system's roots, and a client
//! certificate for mTLS.

use std::path::Path;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use futures_rustls::rustls::{self, ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::runtime::BoxSocket;
use crate::{Error, ErrorKind};

fn config_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("{what} {} cannot be read: {e}", path.display()),
    )
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| config_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error(what, path, e))?;
    if certs.is_empty() {
        return Err(config_error(what, path, "no certificate in it"));
    }
    Ok(certs)
}

/// The client's TLS config: roots from `ca` (else the system's), and the client
/// certificate and key when both are given.
pub(crate) fn client_config(
    ca: Option<&Path>,
    cert_key: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, Error> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            for cert in certs(ca, "the CA file")? {
                roots
                    .add(cert)
                    .map_err(|e| config_error("the CA file", ca, e))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::new(ErrorKind::Config, e))?
        .with_root_certificates(roots);
    let config = match cert_key {
        Some((cert, key)) => {
            let chain = certs(cert, "the client certificate")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| config_error("the client key", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::new(ErrorKind::Config, e))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// Upgrades `socket` to TLS for `host`.
pub(crate) async fn upgrade(
    config: Arc<ClientConfig>,
    host: String,
    socket: BoxSocket,
) -> std::io::Result<BoxSocket> {
    let name = ServerName::try_from(host)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let stream = TlsConnector::from(config).connect(name, socket).await?;
    Ok(Box::new(stream))
}
