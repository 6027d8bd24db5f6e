//! Text armor for certificates and keys: `-----BEGIN <LABEL>-----`, base64, `-----END <LABEL>-----`.
//!
//! Written so that it survives copy-paste: the reader ignores line breaks (LF or CRLF), blank
//! lines, indentation, trailing spaces, text around the blocks and e-mail quoting (`> `).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

const BEGIN: &str = "-----BEGIN ";
const END: &str = "-----END ";
const DASHES: &str = "-----";
const LINE: usize = 64;

/// Why armored text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PemError {
    /// No `-----BEGIN <label>-----` line for the expected label.
    #[error("no \"-----BEGIN {0}-----\" block found")]
    Missing(&'static str),
    /// A block was opened and never closed.
    #[error("\"-----BEGIN {0}-----\" block has no matching END line")]
    Unterminated(String),
    /// The base64 inside a block is damaged.
    #[error("{label} block is not valid base64 ({detail})")]
    Base64 {
        /// The block's label.
        label: String,
        /// What the decoder said.
        detail: String,
    },
}

/// Armors `bytes` under `label`, 64 base64 characters per line, ending with a newline.
pub(crate) fn encode(label: &str, bytes: &[u8]) -> String {
    let b64 = STANDARD.encode(bytes);
    let mut out = String::with_capacity(b64.len() + b64.len() / LINE + 2 * label.len() + 40);
    out.push_str(BEGIN);
    out.push_str(label);
    out.push_str(DASHES);
    out.push('\n');
    for chunk in b64.as_bytes().chunks(LINE) {
        out.push_str(core::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(END);
    out.push_str(label);
    out.push_str(DASHES);
    out.push('\n');
    out
}

/// Every block labelled `label` in `text`, decoded, in order of appearance.
pub(crate) fn decode_all(text: &str, label: &'static str) -> Result<Vec<Vec<u8>>, PemError> {
    let begin = format!("{BEGIN}{label}{DASHES}");
    let end = format!("{END}{label}{DASHES}");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for raw in text.lines() {
        let line = raw
            .trim_start_matches(|c: char| c == '>' || c.is_whitespace())
            .trim_end();
        match &mut current {
            None if line.contains(&begin) => current = Some(String::new()),
            None => {}
            Some(body) if line.contains(&end) => {
                let decoded = STANDARD
                    .decode(body.as_bytes())
                    .map_err(|e| PemError::Base64 {
                        label: label.to_owned(),
                        detail: e.to_string(),
                    })?;
                blocks.push(decoded);
                current = None;
            }
            Some(body) => body.extend(line.chars().filter(|c| !c.is_whitespace())),
        }
    }
    if current.is_some() {
        return Err(PemError::Unterminated(label.to_owned()));
    }
    Ok(blocks)
}

/// The single block labelled `label` (the first one, when there are several).
pub(crate) fn decode_one(text: &str, label: &'static str) -> Result<Vec<u8>, PemError> {
    decode_all(text, label)?
        .into_iter()
        .next()
        .ok_or(PemError::Missing(label))
}

#[cfg(test)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "test data generators wrap on purpose"
)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_line_length() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = encode("TEST", &bytes);
        assert!(
            text.lines()
                .all(|l| l.len() <= LINE || l.starts_with("-----"))
        );
        assert_eq!(decode_one(&text, "TEST").unwrap(), bytes);
    }

    #[test]
    fn survives_copy_paste_damage() {
        let bytes: Vec<u8> = (0..200).map(|i| (i * 7) as u8).collect();
        let clean = encode("TEST", &bytes);
        let crlf = clean.replace('\n', "\r\n");
        let indented: String = clean.lines().map(|l| format!("    {l}   \n")).collect();
        let quoted: String = clean.lines().map(|l| format!("> {l}\n")).collect();
        let blank_lines = clean.replace('\n', "\n\n");
        let one_line_body = {
            let mut lines = clean.lines();
            let first = lines.next().unwrap();
            let rest: Vec<&str> = lines.collect();
            let (body, last) = rest.split_at(rest.len() - 1);
            format!("{first}\n{}\n{}\n", body.join(""), last[0])
        };
        let with_chatter = format!("here is my cert:\n{clean}\nthanks!\n");
        for text in [
            clean.clone(),
            crlf,
            indented,
            quoted,
            blank_lines,
            one_line_body,
            with_chatter,
        ] {
            assert_eq!(decode_one(&text, "TEST").unwrap(), bytes, "{text}");
        }
    }

    #[test]
    fn several_blocks_and_errors() {
        let two = format!("{}{}", encode("TEST", b"one"), encode("TEST", b"two"));
        assert_eq!(
            decode_all(&two, "TEST").unwrap(),
            vec![b"one".to_vec(), b"two".to_vec()]
        );
        assert_eq!(
            decode_one("nothing here", "TEST"),
            Err(PemError::Missing("TEST"))
        );
        assert_eq!(
            decode_one(&encode("OTHER", b"x"), "TEST"),
            Err(PemError::Missing("TEST"))
        );
        let cut = encode("TEST", b"abc").replace("-----END TEST-----", "");
        assert_eq!(
            decode_one(&cut, "TEST"),
            Err(PemError::Unterminated("TEST".into()))
        );
        let bad = "-----BEGIN TEST-----\n!!!!\n-----END TEST-----\n";
        assert!(matches!(
            decode_one(bad, "TEST"),
            Err(PemError::Base64 { .. })
        ));
    }
}
