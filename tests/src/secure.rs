//! A nats-server that enforces authentication and subject permissions, and TLS with
//! certificates made at run time (no private key is committed).
//!
//! [`Users`] writes an `authorization { users: [..] }` block of user/password and
//! nkey users, each with its own [`Permissions`]; [`token`] a token-only block;
//! [`Certs`] a CA, a server certificate for `127.0.0.1`, a client certificate, an
//! expired client certificate and a second, untrusted CA with its own client
//! certificate, as PEM files in a temporary directory; [`Certs::server_tls`] the
//! `tls { .. }` block. Give the blocks to [`NatsServerOptions::config`](crate::NatsServerOptions::config).
//!
//! ```no_run
//! use dagnats_leases_tests::NatsServer;
//! use dagnats_leases_tests::secure::{Certs, Permissions, Users};
//!
//! let certs = Certs::generate();
//! let users = Users::new()
//!     .password("svc", "svc-pw", Permissions::all())
//!     .password("ops", "ops-pw", Permissions::new().publish(["api.leases.owner"]).subscribe(["_INBOX.>"]));
//! let server = NatsServer::builder()
//!     .config(users.config())
//!     .config(certs.server_tls(false))
//!     .start();
//! ```

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;

/// Subjects a user may publish and subscribe to (`allow` lists only, as the README
/// documents them), and whether it may answer requests it received.
#[derive(Clone, Debug, Default)]
pub struct Permissions {
    publish: Vec<String>,
    subscribe: Vec<String>,
    allow_responses: bool,
    all: bool,
}

impl Permissions {
    /// Nothing allowed.
    pub fn new() -> Self {
        Self::default()
    }

    /// No `permissions` block at all: everything allowed.
    pub fn all() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    /// Allows publishing to these subjects (wildcards as NATS has them).
    pub fn publish<S: Into<String>>(mut self, subjects: impl IntoIterator<Item = S>) -> Self {
        self.publish.extend(subjects.into_iter().map(Into::into));
        self
    }

    /// Allows subscribing to these subjects.
    pub fn subscribe<S: Into<String>>(mut self, subjects: impl IntoIterator<Item = S>) -> Self {
        self.subscribe.extend(subjects.into_iter().map(Into::into));
        self
    }

    /// `allow_responses: true`: may publish one reply to a request it received.
    pub fn allow_responses(mut self) -> Self {
        self.allow_responses = true;
        self
    }

    fn config(&self) -> String {
        if self.all {
            return String::new();
        }
        let list = |subjects: &[String]| {
            let quoted: Vec<String> = subjects.iter().map(|s| quote(s)).collect();
            format!("[{}]", quoted.join(", "))
        };
        let mut text = format!(
            ", permissions: {{publish: {{allow: {}}}, subscribe: {{allow: {}}}",
            list(&self.publish),
            list(&self.subscribe)
        );
        if self.allow_responses {
            text += ", allow_responses: true";
        }
        text + "}"
    }
}

/// The users of an `authorization` block.
#[derive(Clone, Debug, Default)]
pub struct Users {
    entries: Vec<String>,
}

impl Users {
    /// No users yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A user with a password.
    pub fn password(mut self, user: &str, password: &str, permissions: Permissions) -> Self {
        self.entries.push(format!(
            "{{user: {}, password: {}{}}}",
            quote(user),
            quote(password),
            permissions.config()
        ));
        self
    }

    /// An nkey user: the server knows the public key; the client signs with the seed.
    pub fn nkey(mut self, public_key: &str, permissions: Permissions) -> Self {
        self.entries.push(format!(
            "{{nkey: {}{}}}",
            quote(public_key),
            permissions.config()
        ));
        self
    }

    /// The `authorization { users: [..] }` block.
    pub fn config(&self) -> String {
        format!(
            "authorization {{\n  users: [\n    {}\n  ]\n}}",
            self.entries.join("\n    ")
        )
    }
}

/// A token-only `authorization` block (nats-server takes a token or users, not both).
pub fn token(token: &str) -> String {
    format!("authorization {{ token: {} }}", quote(token))
}

/// A fresh nkey user: `(seed, public key)`.
pub fn nkey_user() -> (String, String) {
    let pair = nkeys::KeyPair::new_user();
    (
        pair.seed().expect("a new pair has a seed"),
        pair.public_key(),
    )
}

/// Certificates made for one test, as PEM files in a temporary directory.
pub struct Certs {
    dir: TempDir,
}

impl Certs {
    /// Makes a CA, a server certificate (`127.0.0.1`, `localhost`) and a client
    /// certificate signed by it, a client certificate of that CA that expired
    /// yesterday, and a second CA nobody trusts with a client certificate of its own.
    pub fn generate() -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("dagnats-certs-")
            .tempdir()
            .expect("a temporary directory");
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write a PEM file");
        };
        let ca = |name: &str| {
            let key = KeyPair::generate().expect("a CA key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let cert = params.self_signed(&key).expect("a self-signed CA");
            (cert, key)
        };
        let (ca_cert, ca_key) = ca("dagnats test CA");
        let (rogue_cert, rogue_key) = ca("an untrusted CA");
        write("ca.pem", ca_cert.pem());
        write("rogue-ca.pem", rogue_cert.pem());
        let leaf = |sans: Vec<String>,
                    purpose: ExtendedKeyUsagePurpose,
                    issuer: &rcgen::Certificate,
                    issuer_key: &KeyPair,
                    expired: bool| {
            let key = KeyPair::generate().expect("a leaf key");
            let mut params = CertificateParams::new(sans).expect("leaf params");
            params
                .distinguished_name
                .push(DnType::CommonName, "dagnats");
            params.extended_key_usages = vec![purpose];
            if expired {
                let now = time::OffsetDateTime::now_utc();
                params.not_before = now - time::Duration::days(30);
                params.not_after = now - time::Duration::days(1);
            }
            let cert = params
                .signed_by(&key, issuer, issuer_key)
                .expect("a signed leaf");
            (cert.pem(), key.serialize_pem())
        };
        let server_sans = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let (cert, key) = leaf(
            server_sans,
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca_cert,
            &ca_key,
            false,
        );
        write("server.pem", cert);
        write("server-key.pem", key);
        for (name, issuer, issuer_key, expired) in [
            ("client", &ca_cert, &ca_key, false),
            ("expired-client", &ca_cert, &ca_key, true),
            ("rogue-client", &rogue_cert, &rogue_key, false),
        ] {
            let (cert, key) = leaf(
                vec!["client".to_owned()],
                ExtendedKeyUsagePurpose::ClientAuth,
                issuer,
                issuer_key,
                expired,
            );
            write(&format!("{name}.pem"), cert);
            write(&format!("{name}-key.pem"), key);
        }
        Certs { dir }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA that signed neither (a client trusting it refuses the server).
    pub fn rogue_ca(&self) -> PathBuf {
        self.dir.path().join("rogue-ca.pem")
    }

    /// A client certificate and key: `client`, `expired-client` or `rogue-client`.
    pub fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}-key.pem")),
        )
    }

    /// The server's `tls { .. }` block; `verify` demands a client certificate
    /// signed by the CA (mutual TLS).
    pub fn server_tls(&self, verify: bool) -> String {
        let path = |name: &str| quote(&self.dir.path().join(name).to_string_lossy());
        format!(
            "tls {{\n  cert_file: {}\n  key_file: {}\n  ca_file: {}\n  verify: {verify}\n  timeout: 5\n}}",
            path("server.pem"),
            path("server-key.pem"),
            path("ca.pem"),
        )
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

/// Decentralised auth (operator mode) for `.creds` users: an operator, one account
/// with JetStream (its JWT preloaded into a memory resolver), and users whose JWTs
/// the account signs with their [`Permissions`], written as `.creds` files. A user
/// signed by a second account key the operator never signed is refused.
pub struct Operator {
    operator: nats_io_jwt::KeyPair,
    account: nats_io_jwt::KeyPair,
    system: nats_io_jwt::KeyPair,
    rogue_account: nats_io_jwt::KeyPair,
    dir: TempDir,
}

impl Operator {
    /// New keys for the operator and the account.
    pub fn generate() -> Operator {
        Operator {
            operator: nats_io_jwt::KeyPair::new_operator(),
            account: nats_io_jwt::KeyPair::new_account(),
            system: nats_io_jwt::KeyPair::new_account(),
            rogue_account: nats_io_jwt::KeyPair::new_account(),
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// The server's `operator`, `system_account`, `resolver` and `resolver_preload`
    /// settings (JetStream needs a system account in operator mode).
    pub fn server_config(&self) -> String {
        use nats_io_jwt::{Account, Operator as OperatorClaims, OperatorLimits, Token};
        let operator_claims: OperatorClaims = OperatorClaims::builder()
            .try_into()
            .expect("operator claims");
        let operator_jwt = Token::new(self.operator.public_key())
            .name("dagnats-test-operator")
            .claims(operator_claims)
            .sign(&self.operator);
        // JetStream on, unlimited (-1), which the leases bucket needs.
        let limits: OperatorLimits = OperatorLimits::builder()
            .disk_storage(-1)
            .mem_storage(-1)
            .streams(-1)
            .consumer(-1)
            .try_into()
            .expect("account limits");
        let account: Account = Account::builder()
            .limits(Some(limits))
            .try_into()
            .expect("account claims");
        let account_jwt = Token::new(self.account.public_key())
            .name("leases")
            .claims(account)
            .sign(&self.operator);
        let system: Account = Account::builder().try_into().expect("system claims");
        let system_jwt = Token::new(self.system.public_key())
            .name("SYS")
            .claims(system)
            .sign(&self.operator);
        format!(
            "operator: {}\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{ {}: {}, {}: {} }}\n",
            quote(&operator_jwt),
            self.system.public_key(),
            self.account.public_key(),
            quote(&account_jwt),
            self.system.public_key(),
            quote(&system_jwt)
        )
    }

    /// A `.creds` file for user `name` with `permissions`, signed by the account.
    pub fn creds(&self, name: &str, permissions: &Permissions) -> PathBuf {
        self.write_creds(name, permissions, &self.account)
    }

    /// A `.creds` file signed by an account the operator never signed.
    pub fn rogue_creds(&self, name: &str) -> PathBuf {
        self.write_creds(name, &Permissions::all(), &self.rogue_account)
    }

    fn write_creds(
        &self,
        name: &str,
        permissions: &Permissions,
        account: &nats_io_jwt::KeyPair,
    ) -> PathBuf {
        use nats_io_jwt::{Permission, ResponsePermission, Token, User};
        let user_key = nats_io_jwt::KeyPair::new_user();
        let mut user = User::builder().bearer_token(false);
        if !permissions.all {
            user = user
                .pub_(Some(Permission::from(permissions.publish.clone())))
                .sub(Some(Permission::from(permissions.subscribe.clone())));
            if permissions.allow_responses {
                let resp = ResponsePermission {
                    max: Some(1),
                    ttl: None,
                };
                user = user.resp(Some(resp));
            }
        }
        let user: User = user.try_into().expect("user claims");
        let jwt = Token::new(user_key.public_key())
            .name(name)
            .claims(user)
            .sign(account);
        let seed = user_key.seed().expect("a user seed");
        let text = format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        let path = self.dir.path().join(format!("{name}.creds"));
        std::fs::write(&path, text).expect("write the creds file");
        path
    }
}
