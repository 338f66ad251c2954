//! The five request/reply subjects of the lease API.

/// The five request/reply subjects of the lease API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `api.leases.acquire`
    Acquire,
    /// `api.leases.renew`
    Renew,
    /// `api.leases.release`
    Release,
    /// `api.leases.owner`
    Owner,
    /// `api.leases.forward`
    Forward,
}

impl Endpoint {
    /// Every endpoint, in the order the docs list them.
    pub const ALL: [Self; 5] = [
        Self::Acquire,
        Self::Renew,
        Self::Release,
        Self::Owner,
        Self::Forward,
    ];

    /// The last subject token, which is also the micro-service endpoint name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Owner => "owner",
            Self::Forward => "forward",
        }
    }

    /// The full request subject, e.g. `api.leases.acquire`.
    pub fn subject(self) -> String {
        format!("{}.{}", crate::subjects::API_PREFIX, self.name())
    }

    /// The endpoint for a full subject or a bare name.
    pub fn from_subject(subject: &str) -> Option<Self> {
        let name = subject
            .strip_prefix(crate::subjects::API_PREFIX)
            .and_then(|s| s.strip_prefix('.'))
            .unwrap_or(subject);
        Self::ALL.into_iter().find(|e| e.name() == name)
    }
}
