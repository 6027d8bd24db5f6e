//! The command line's changes to the registry, made by the running cloud (its admin
//! socket, docs/protocol.md §8) when one listens, else by the command itself on the store,
//! as the store's owner: either way the same change, audit row and answer.

use std::path::Path;

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;

use cyphonic_cloud::api::TokenRevoked;

/// A change the command line asks for: the API's request, and the same change made on the
/// store when no cloud runs.
pub(crate) struct Change<'a> {
    /// The request's method.
    pub(crate) method: reqwest::Method,
    /// Its path below `/api/v1`, a segment at a time (each is escaped).
    pub(crate) path: &'a [&'a str],
    /// Its JSON body.
    pub(crate) body: Option<serde_json::Value>,
}

impl Change<'_> {
    /// Makes the change through the cloud `config` names, or, when none listens on its
    /// admin socket, with `locally` on its store: the answer, as the API gives it.
    ///
    /// # Errors
    /// The configuration cannot be read; the socket is there but cannot be used (say, by a
    /// user other than root and the cloud's); what the change refuses.
    pub(crate) fn make<T: DeserializeOwned, L: Serialize>(
        &self,
        config: &Path,
        now: u64,
        locally: impl FnOnce(&crate::Registry) -> anyhow::Result<L>,
    ) -> anyhow::Result<T> {
        let config = cyphonic_cloud::config::load(config, now)?;
        let answer = match self.through(&config.admin_socket)? {
            Some(answer) => answer,
            None => {
                let registry = crate::Registry::with(config)?;
                serde_json::to_value(locally(&registry)?)?
            }
        };
        serde_json::from_value(answer).context("the cloud's answer does not read")
    }

    /// The running cloud's answer from `socket`; `None` when no cloud listens there (no
    /// socket, or the connection refused).
    fn through(&self, socket: &Path) -> anyhow::Result<Option<serde_json::Value>> {
        use std::io::ErrorKind;
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
                return Ok(None);
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "reaching the running cloud at {} (admin_socket; are you root or its user?)",
                        socket.display()
                    )
                });
            }
        }
        let mut url = reqwest::Url::parse("http://cloud/api/v1").context("the URL")?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("the URL has no path"))?
            .extend(self.path);
        let client = reqwest::Client::builder()
            .unix_socket(socket)
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .context("the admin socket's client")?;
        let mut request = client.request(self.method.clone(), url);
        if let Some(body) = &self.body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(body)?);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        let (status, text) = runtime
            .block_on(async {
                let answer = request.send().await?;
                let status = answer.status();
                Ok::<_, reqwest::Error>((status, answer.bytes().await?))
            })
            .with_context(|| format!("asking the running cloud at {}", socket.display()))?;
        let answer: serde_json::Value = serde_json::from_slice(&text)
            .with_context(|| format!("the running cloud answered {status} with no JSON"))?;
        if !status.is_success() {
            match answer["error"]["message"].as_str() {
                Some(message) => bail!("{message}"),
                None => bail!("the running cloud answered {status}: {answer}"),
            }
        }
        Ok(Some(answer))
    }
}

/// Revokes the token `id` among `collection` (`enrollment-tokens`, `api-tokens`) through
/// the running cloud, or with `locally` (whether it was live); says which, calling it
/// `what`.
///
/// # Errors
/// As [`Change::make`].
pub(crate) fn revoke_token(
    config: &Path,
    now: u64,
    (collection, what): (&str, &str),
    id: &str,
    locally: impl FnOnce(&crate::Registry) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let revoked: TokenRevoked = Change {
        method: reqwest::Method::DELETE,
        path: &[collection, id],
        body: None,
    }
    .make(config, now, |registry| {
        Ok(TokenRevoked {
            was_live: locally(registry)?,
        })
    })?;
    let id = id.trim().to_ascii_lowercase();
    let said = if revoked.was_live {
        format!("revoked {what} {id}")
    } else {
        format!("{what} {id} was revoked already")
    };
    #[expect(clippy::print_stdout, reason = "the command's output")]
    {
        println!("{said}");
    }
    Ok(())
}
