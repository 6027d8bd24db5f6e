//! An enrollment token's text (docs/protocol.md §4, *Enrollment*): `<id>.<secret>`, the id 16
//! hex digits (names the token; not secret), the secret 64 hex digits (32 random bytes). The
//! cloud makes and redeems tokens; a tunnel end checks one's shape before it asks with it.

/// What an enrollment token looks like, for messages.
pub const TOKEN_SHAPE: &str = "<16 hex digits>.<64 hex digits>";

/// The id and the secret of the token `text` (white space around it ignored), decoded; `None`
/// when it is not of the shape [`TOKEN_SHAPE`].
pub fn parse_token(text: &str) -> Option<([u8; 8], [u8; 32])> {
    let (id, secret) = text.trim().split_once('.')?;
    let mut raw_id = [0u8; 8];
    let mut raw_secret = [0u8; 32];
    hex::decode_to_slice(id, &mut raw_id).ok()?;
    hex::decode_to_slice(secret, &mut raw_secret).ok()?;
    Some((raw_id, raw_secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sixteen_and_sixty_four_hex_digits_make_a_token() {
        let good = format!("0123456789abcdef.{}", "ab".repeat(32));
        let (id, secret) = parse_token(&format!(" {good}\n")).unwrap();
        assert_eq!(id, [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
        assert_eq!(secret, [0xab; 32]);
        for bad in [
            "garbage",
            "0123456789abcdef",
            &format!("0123456789abcde.{}", "ab".repeat(32)),
            &format!("0123456789abcdef.{}", "ab".repeat(31)),
            &format!("0123456789abcdeg.{}", "ab".repeat(32)),
            &format!("0123456789abcdef.{}.x", "ab".repeat(32)),
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }
}
