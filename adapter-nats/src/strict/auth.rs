//! Credentials for the strict connection: an nkey seed's signer and a creds
//! file's JWT and seed.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use dagnats_leases_core::proto::NonceSigner;

use crate::{Error, ErrorKind};

/// Signs the server's nonce with an nkey (the `nkeys` crate).
pub(crate) struct NkeySigner(nkeys::KeyPair);

impl std::fmt::Debug for NkeySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed.
        f.debug_tuple("NkeySigner")
            .field(&self.0.public_key())
            .finish()
    }
}

impl NonceSigner for NkeySigner {
    fn sign(&self, nonce: &[u8]) -> String {
        // Signing with a key pair made from a seed does not fail.
        let signature = self.0.sign(nonce).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature)
    }
}

/// The signer of a seed, and its public key.
pub(crate) fn signer(seed: &str) -> Result<(String, Arc<dyn NonceSigner>), Error> {
    let pair = nkeys::KeyPair::from_seed(seed.trim()).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("the nkey seed is not valid: {e}"),
        )
    })?;
    Ok((pair.public_key(), Arc::new(NkeySigner(pair))))
}

/// A creds file's user JWT and nkey seed: the first line inside each
/// `-----BEGIN ...-----` block, the JWT's first, the seed's second.
pub(crate) fn read_creds(path: &Path) -> Result<(String, String), Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("the creds file {} cannot be read: {e}", path.display()),
        )
    })?;
    let mut blocks = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line.starts_with("---")
            && line.contains("BEGIN")
            && let Some(body) = lines.by_ref().find(|l| !l.is_empty())
            && !body.starts_with("---")
        {
            blocks.push(body.to_string());
        }
    }
    match blocks.as_slice() {
        [jwt, seed, ..] => Ok((jwt.clone(), seed.clone())),
        _ => Err(Error::new(
            ErrorKind::Config,
            format!(
                "the creds file {} has no JWT and seed blocks",
                path.display()
            ),
        )),
    }
}
