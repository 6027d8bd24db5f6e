//! People sign in with OpenID Connect (docs/protocol.md §8, Who may do what): the
//! authorization code flow with PKCE against the organisation's provider, through the
//! `openidconnect` crate, which checks the ID token (signature against the issuer's keys,
//! issuer, audience, expiry, nonce). The person's role comes from one claim of the ID token,
//! or of the provider's userinfo when the ID token lacks it.
//!
//! Nothing is kept on the server before the provider sends the person back: the flow's
//! state, nonce and PKCE verifier ride in the browser's own `__Host-` cookie
//! ([`Pending`]), so that sign-in starts fill no table.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreErrorResponseType, CoreGenderClaim, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
    CoreResponseType, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::url;
use openidconnect::{
    AdditionalClaims, AuthenticationFlow, AuthorizationCode, ClientId, ClientSecret, CsrfToken,
    EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdTokenFields, IssuerUrl,
    Nonce, OAuth2TokenResponse as _, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl,
    StandardErrorResponse, StandardTokenResponse, UserInfoClaims,
};
use serde::{Deserialize, Serialize};

/// What a person may do, from their provider's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees everything but secrets (what the `read` scope allows).
    Viewer,
    /// Also makes and revokes enrollment tokens and revokes members (`write`).
    Operator,
    /// Also makes and revokes API tokens (`admin`).
    Admin,
}

impl Role {
    /// Its word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
            Self::Admin => "admin",
        }
    }

    /// The role a word names.
    pub fn parse(word: &str) -> Option<Self> {
        [Self::Viewer, Self::Operator, Self::Admin]
            .into_iter()
            .find(|r| r.as_str() == word)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[api.oidc]`: the provider, this client, and who gets which role.
#[derive(Clone, PartialEq, Eq)]
pub struct OidcConfig {
    /// The provider's issuer URL (its discovery document is under it).
    pub issuer: String,
    /// This client's id at the provider.
    pub client_id: String,
    /// This client's secret, read from `client_secret_file`.
    pub client_secret: String,
    /// The console's address as browsers reach it: the redirect URL is its
    /// `/auth/callback`, and writes from a session must come from its origin.
    pub url: url::Url,
    /// The claim whose values name roles (`groups`).
    pub claim: String,
    /// The values of `claim` that give each role, the highest role first; `"*"` is anyone
    /// the provider signs in.
    pub roles: Vec<(Role, Vec<String>)>,
    /// The scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// A session ends this long after sign-in...
    pub session: Duration,
    /// ...or this long after its last request.
    pub idle: Duration,
}

impl fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("url", &self.url.as_str())
            .field("claim", &self.claim)
            .field("roles", &self.roles)
            .field("scopes", &self.scopes)
            .field("session", &self.session)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

/// The path the provider sends people back to.
pub const CALLBACK: &str = "/auth/callback";

impl OidcConfig {
    /// Where the provider sends people back.
    pub fn redirect(&self) -> url::Url {
        let mut u = self.url.clone();
        u.set_path(CALLBACK);
        u.set_query(None);
        u
    }

    /// The origin writes from a session must come from (`https://host[:port]`).
    pub fn origin(&self) -> String {
        self.url.origin().ascii_serialization()
    }

    /// The highest role the claim's `values` give, if any.
    pub fn role_of(&self, values: &[String]) -> Option<Role> {
        self.roles
            .iter()
            .find(|(_, wanted)| {
                wanted
                    .iter()
                    .any(|w| w == "*" || values.iter().any(|v| v == w))
            })
            .map(|(role, _)| *role)
    }
}

/// Every claim of an ID token or a userinfo answer beyond the standard ones, so that the
/// role claim may have any name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OtherClaims {
    #[serde(flatten)]
    all: BTreeMap<String, serde_json::Value>,
}
impl AdditionalClaims for OtherClaims {}

impl OtherClaims {
    /// The values of claim `name`: a string is one, an array of strings many; none when
    /// absent.
    fn values(&self, name: &str) -> Option<Vec<String>> {
        match self.all.get(name)? {
            serde_json::Value::String(s) => Some(vec![s.clone()]),
            serde_json::Value::Array(a) => Some(
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            ),
            _ => Some(Vec::new()),
        }
    }
}

type Fields = IdTokenFields<
    OtherClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type TokenResponse = StandardTokenResponse<Fields, CoreTokenType>;
type OidcClient = openidconnect::Client<
    OtherClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    TokenResponse,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// Why a sign-in did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignInError {
    /// The provider cannot be asked (discovery, a request, a malformed answer): the person
    /// may try again later.
    #[error("the sign-in provider cannot be reached: {0}")]
    Provider(String),
    /// What came back does not prove who the person is: a state that is not this browser's,
    /// a code the provider refuses, an ID token whose signature, issuer, audience, expiry or
    /// nonce is wrong, or the provider's own refusal.
    #[error("{0}")]
    Refused(String),
    /// The provider knows the person, but no role is theirs.
    #[error("{name} may not use the console: no role of theirs is named in [api.oidc]")]
    NoRole {
        /// The provider's subject.
        subject: String,
        /// How the person is shown.
        name: String,
    },
}

/// A sign-in under way: what the callback checks and needs, kept in the person's browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    state: String,
    nonce: String,
    verifier: String,
}

impl Pending {
    /// The cookie's value.
    pub fn to_cookie(&self) -> String {
        format!("{}.{}.{}", self.state, self.nonce, self.verifier)
    }

    /// A cookie's value read back: three parts of URL-safe base64 (what the crate makes),
    /// else none.
    pub fn from_cookie(value: &str) -> Option<Self> {
        let mut parts = value.split('.');
        let (state, nonce, verifier) = (parts.next()?, parts.next()?, parts.next()?);
        let fine = |s: &str| {
            (16..=128).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        (parts.next().is_none() && fine(state) && fine(nonce) && fine(verifier)).then(|| Self {
            state: state.to_owned(),
            nonce: nonce.to_owned(),
            verifier: verifier.to_owned(),
        })
    }

    /// Whether `state` (from the provider's redirect) is this sign-in's.
    pub fn is_state(&self, state: &str) -> bool {
        same_secret(&self.state, state)
    }
}

/// Whether two secrets are the same, without a comparison whose time tells about either:
/// their digests are compared, and how long that takes tells nothing about the secret.
pub fn same_secret(a: &str, b: &str) -> bool {
    let digest = |s: &str| ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    digest(a).as_ref() == digest(b).as_ref()
}

/// A person the provider signed in, with the role they get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// The provider's subject.
    pub subject: String,
    /// Their email, else their name, else the subject.
    pub name: String,
    /// What they may do.
    pub role: Role,
}

/// How long what discovery found is used before it is read again.
const DISCOVERY_KEPT: Duration = Duration::from_secs(600);
/// After a failed discovery, how long before another is tried.
const DISCOVERY_RETRY: Duration = Duration::from_secs(5);
/// Requests to the provider under way at once; beyond that a sign-in is refused at once.
const AT_ONCE: usize = 16;

/// The provider, as this cloud asks it.
#[derive(Debug)]
pub struct Provider {
    config: OidcConfig,
    http: reqwest::Client,
    known: tokio::sync::Mutex<Option<(Result<OidcClient, String>, Instant)>>,
    at_once: tokio::sync::Semaphore,
}

impl Provider {
    /// A provider asked as `config` says; nothing is asked yet.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(config: OidcConfig) -> Result<Self, SignInError> {
        let http = reqwest::Client::builder()
            // Following redirects would let the provider's answers send us anywhere.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| SignInError::Provider(e.to_string()))?;
        Ok(Self {
            config,
            http,
            known: tokio::sync::Mutex::new(None),
            at_once: tokio::sync::Semaphore::new(AT_ONCE),
        })
    }

    /// Its settings.
    pub const fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// The client, from discovery kept for [`DISCOVERY_KEPT`] (a failure for
    /// [`DISCOVERY_RETRY`]).
    async fn client(&self) -> Result<OidcClient, SignInError> {
        let mut known = self.known.lock().await;
        if let Some((client, at)) = known.as_ref() {
            let kept = if client.is_ok() {
                DISCOVERY_KEPT
            } else {
                DISCOVERY_RETRY
            };
            if at.elapsed() < kept {
                return client.clone().map_err(SignInError::Provider);
            }
        }
        let found = self.discover().await;
        *known = Some((found.clone(), Instant::now()));
        found.map_err(SignInError::Provider)
    }

    async fn discover(&self) -> Result<OidcClient, String> {
        let issuer = IssuerUrl::new(self.config.issuer.clone()).map_err(|e| e.to_string())?;
        let metadata = CoreProviderMetadata::discover_async(issuer, &self.http)
            .await
            .map_err(|e| format!("discovery at {}: {e}", self.config.issuer))?;
        let redirect =
            RedirectUrl::new(self.config.redirect().to_string()).map_err(|e| e.to_string())?;
        Ok(OidcClient::from_provider_metadata(
            metadata,
            ClientId::new(self.config.client_id.clone()),
            Some(ClientSecret::new(self.config.client_secret.clone())),
        )
        .set_redirect_uri(redirect))
    }

    /// Starts a sign-in: where to send the person, and what their browser keeps meanwhile.
    ///
    /// # Errors
    /// `Provider` when discovery fails.
    pub async fn begin(&self) -> Result<(url::Url, Pending), SignInError> {
        let client = self.client().await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(
                AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for scope in &self.config.scopes {
            request = request.add_scope(openidconnect::Scope::new(scope.clone()));
        }
        let (url, state, nonce) = request.url();
        Ok((
            url,
            Pending {
                state: state.into_secret(),
                nonce: nonce.secret().clone(),
                verifier: verifier.into_secret(),
            },
        ))
    }

    /// Finishes the sign-in `pending` began, with the `code` the provider sent back (its
    /// `state` already checked): the person, if the provider proves who they are and a role
    /// is theirs.
    ///
    /// # Errors
    /// `Refused` for anything that does not prove who the person is, `NoRole` when nothing
    /// gives them a role, `Provider` when the provider cannot be asked.
    pub async fn finish(&self, pending: &Pending, code: &str) -> Result<Person, SignInError> {
        let _turn = self
            .at_once
            .try_acquire()
            .map_err(|_| SignInError::Provider("too many sign-ins at once".into()))?;
        let client = self.client().await?;
        let response = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|e| SignInError::Provider(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier.clone()))
            .request_async(&self.http)
            .await
            .map_err(|e| match e {
                openidconnect::RequestTokenError::ServerResponse(r) => {
                    SignInError::Refused(format!("the provider refused the code: {r}"))
                }
                other => SignInError::Provider(format!("the token request failed: {other}")),
            })?;
        let id_token = response
            .extra_fields()
            .id_token()
            .ok_or_else(|| SignInError::Refused("the provider sent no ID token".into()))?;
        let claims = id_token
            .claims(
                &client.id_token_verifier(),
                &Nonce::new(pending.nonce.clone()),
            )
            .map_err(|e| SignInError::Refused(format!("the ID token is refused: {e}")))?;
        let subject = claims.subject().to_string();
        let name = claims
            .email()
            .map(|e| e.to_string())
            .or_else(|| {
                claims
                    .name()
                    .and_then(|n| n.get(None))
                    .map(|n| n.to_string())
            })
            .unwrap_or_else(|| subject.clone());
        let values = match claims.additional_claims().values(&self.config.claim) {
            Some(v) => v,
            None => self
                .userinfo_values(&client, response.access_token().clone(), claims.subject())
                .await?
                .unwrap_or_default(),
        };
        let role = self
            .config
            .role_of(&values)
            .ok_or_else(|| SignInError::NoRole {
                subject: subject.clone(),
                name: name.clone(),
            })?;
        Ok(Person {
            subject,
            name,
            role,
        })
    }

    /// The role claim's values from the provider's userinfo, for the subject the ID token
    /// named; none without a userinfo endpoint or the claim.
    async fn userinfo_values(
        &self,
        client: &OidcClient,
        access: openidconnect::AccessToken,
        subject: &openidconnect::SubjectIdentifier,
    ) -> Result<Option<Vec<String>>, SignInError> {
        let Ok(request) = client.user_info(access, Some(subject.clone())) else {
            return Ok(None);
        };
        let info: UserInfoClaims<OtherClaims, CoreGenderClaim> = request
            .request_async(&self.http)
            .await
            .map_err(|e| SignInError::Provider(format!("userinfo: {e}")))?;
        Ok(info.additional_claims().values(&self.config.claim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(roles: Vec<(Role, Vec<&str>)>) -> OidcConfig {
        OidcConfig {
            issuer: "https://id.example.com".into(),
            client_id: "cyphonic".into(),
            client_secret: "s".into(),
            url: "https://cloud.example.com:8443/console/".parse().unwrap(),
            claim: "groups".into(),
            roles: roles
                .into_iter()
                .map(|(r, v)| (r, v.into_iter().map(str::to_owned).collect()))
                .collect(),
            scopes: vec![],
            session: Duration::from_secs(3600),
            idle: Duration::from_secs(600),
        }
    }

    /// The highest role any value names wins; `*` is anyone; no value, no role.
    #[test]
    fn roles_come_from_the_claims_values_highest_first() {
        let c = config(vec![
            (Role::Admin, vec!["net-admins"]),
            (Role::Operator, vec!["net-ops", "noc"]),
            (Role::Viewer, vec!["staff"]),
        ]);
        let v = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(c.role_of(&v(&["staff"])), Some(Role::Viewer));
        assert_eq!(c.role_of(&v(&["staff", "noc"])), Some(Role::Operator));
        assert_eq!(c.role_of(&v(&["net-admins", "staff"])), Some(Role::Admin));
        assert_eq!(c.role_of(&v(&["guests"])), None);
        assert_eq!(c.role_of(&[]), None);
        let anyone = config(vec![(Role::Viewer, vec!["*"])]);
        assert_eq!(anyone.role_of(&[]), Some(Role::Viewer));
        assert_eq!(
            c.redirect().as_str(),
            "https://cloud.example.com:8443/auth/callback"
        );
        assert_eq!(c.origin(), "https://cloud.example.com:8443");
    }

    /// A claim is a string or an array of strings; anything else gives no value.
    #[test]
    fn a_claim_reads_as_one_or_many_values() {
        let claims: OtherClaims = serde_json::from_value(serde_json::json!({
            "groups": ["a", "b", 3],
            "role": "ops",
            "odd": {"x": 1}
        }))
        .unwrap();
        assert_eq!(claims.values("groups"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(claims.values("role"), Some(vec!["ops".into()]));
        assert_eq!(claims.values("odd"), Some(vec![]));
        assert_eq!(claims.values("none"), None);
    }

    /// The cookie carries the three parts back exactly; anything else reads as none, and a
    /// state is checked whole.
    #[test]
    fn a_pending_sign_in_reads_back_only_whole() {
        let p = Pending {
            state: "s".repeat(22),
            nonce: "n".repeat(22),
            verifier: "v".repeat(43),
        };
        assert_eq!(Pending::from_cookie(&p.to_cookie()), Some(p.clone()));
        for bad in [
            String::new(),
            format!("{}.{}", "s".repeat(22), "n".repeat(22)),
            format!("{}.x", p.to_cookie()),
            p.to_cookie().replace('v', "%"),
            format!("short.{}.{}", "n".repeat(22), "v".repeat(43)),
        ] {
            assert_eq!(Pending::from_cookie(&bad), None, "{bad:?}");
        }
        assert!(p.is_state(&"s".repeat(22)));
        assert!(!p.is_state(&"s".repeat(21)));
        assert!(!p.is_state(&format!("{}t", "s".repeat(21))));
    }
}
