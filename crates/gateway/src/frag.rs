//! IPv4 fragmentation (RFC 791 §3.2, "An Example Fragmentation Procedure"), for packets
//! larger than the tunnel's inner MTU that do not forbid it. This includes fragments the
//! device's stack already made for its own 1500-byte link: a fragment may be fragmented again.

use crate::IPV4_MIN_HEADER;
use crate::ipv4::{self, Header, Invalid};

const FLAG_MF: u16 = 0x2000;
const OPT_EOL: u8 = 0;
const OPT_NOP: u8 = 1;
/// The "copied" bit of an option type: the option goes into every fragment.
const OPT_COPIED: u8 = 0x80;

/// Why a packet cannot be fragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FragError {
    /// Not a whole, valid IPv4 packet (a fragment ending past the 65,535 bytes of a
    /// datagram among them: no datagram is that long, and refragmenting it would overflow
    /// its pieces' offsets into the flag bits).
    #[error("not a whole, valid IPv4 packet")]
    Malformed,
    /// Don't Fragment is set: send fragmentation-needed instead.
    #[error("Don't Fragment is set")]
    DontFragment,
    /// The MTU leaves no room for 8 payload bytes after the header.
    #[error("MTU too small to fragment into")]
    MtuTooSmall,
}

/// Splits one IPv4 packet into fragments that fit `mtu`, one at a time into the caller's
/// buffers. Fragment payloads are multiples of 8 bytes except the last; the first fragment
/// carries all options, later ones only those with the copied bit.
#[derive(Debug)]
pub struct Fragmenter<'a> {
    packet: &'a [u8],
    h: Header,
    /// Header of the later fragments (options with the copied bit, padded).
    later_header: [u8; 60],
    later_header_len: usize,
    mtu: usize,
    /// Payload bytes already emitted.
    done: usize,
}

impl<'a> Fragmenter<'a> {
    /// Prepares to fragment `packet` (a whole IPv4 packet) for `mtu`.
    ///
    /// # Errors
    /// [`FragError`] when the packet is malformed, has DF set, or the MTU is absurdly small.
    pub fn new(packet: &'a [u8], mtu: u16) -> Result<Self, FragError> {
        let h = Header::parse(packet, true).map_err(|_: Invalid| FragError::Malformed)?;
        if h.df {
            return Err(FragError::DontFragment);
        }
        let mtu = usize::from(mtu);
        if mtu < h.header_len + 8 {
            return Err(FragError::MtuTooSmall);
        }
        let mut later_header = [0u8; 60];
        later_header[..IPV4_MIN_HEADER].copy_from_slice(&packet[..IPV4_MIN_HEADER]);
        let mut len = IPV4_MIN_HEADER;
        let opts = &packet[IPV4_MIN_HEADER..h.header_len];
        let mut i = 0;
        while i < opts.len() {
            match opts[i] {
                OPT_EOL => break,
                OPT_NOP => i += 1,
                kind => {
                    let olen = usize::from(*opts.get(i + 1).unwrap_or(&0));
                    if olen < 2 || i + olen > opts.len() {
                        return Err(FragError::Malformed);
                    }
                    if kind & OPT_COPIED != 0 {
                        later_header[len..len + olen].copy_from_slice(&opts[i..i + olen]);
                        len += olen;
                    }
                    i += olen;
                }
            }
        }
        // Pad the options to a multiple of 4 bytes with end-of-list (already zero).
        let later_header_len = len.div_ceil(4) * 4;
        if mtu < later_header_len + 8 {
            return Err(FragError::MtuTooSmall);
        }
        Ok(Self {
            packet,
            h,
            later_header,
            later_header_len,
            mtu,
            done: 0,
        })
    }

    /// Whether the packet needs fragmenting at all.
    pub fn needed(&self) -> bool {
        self.h.total_len > self.mtu
    }

    /// Writes the next fragment (a whole IPv4 packet) into `out` and returns its length, or
    /// None when all fragments were written (or `out` is too small for the next one).
    pub fn next_into(&mut self, out: &mut [u8]) -> Option<usize> {
        let payload = &self.packet[self.h.header_len..self.h.total_len];
        if self.done >= payload.len() && !(self.done == 0 && payload.is_empty()) {
            return None;
        }
        let first = self.done == 0;
        let header: &[u8] = if first {
            &self.packet[..self.h.header_len]
        } else {
            &self.later_header[..self.later_header_len]
        };
        let room = self.mtu - header.len();
        let remaining = payload.len() - self.done;
        let last = remaining <= room;
        let take = if last { remaining } else { room / 8 * 8 };
        let total = header.len() + take;
        let frag = out.get_mut(..total)?;
        frag[..header.len()].copy_from_slice(header);
        frag[header.len()..].copy_from_slice(&payload[self.done..self.done + take]);
        // Header length field reflects this fragment's header; offsets add up to the original
        // packet's own offset (it may be a fragment itself), and MF stays set on all but the
        // last piece of a packet that was itself the last.
        frag[0] = 0x40 | u8::try_from(header.len() / 4).expect("header <= 60 bytes");
        frag[2..4].copy_from_slice(
            &u16::try_from(total)
                .expect("total <= mtu <= u16")
                .to_be_bytes(),
        );
        let offset =
            self.h.frag_offset + u16::try_from(self.done / 8).expect("offsets fit 13 bits");
        let mf = !last || self.h.mf;
        let flags = (if mf { FLAG_MF } else { 0 }) | offset;
        frag[6..8].copy_from_slice(&flags.to_be_bytes());
        ipv4::fill_header_checksum(frag, header.len());
        self.done += take.max(usize::from(payload.is_empty()));
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::ipv4_sized;

    /// Reassembles fragments by offset and checks they reproduce the original payload.
    fn reassemble(frags: &[Vec<u8>]) -> (Vec<u8>, bool) {
        let mut payload = Vec::new();
        let mut last_mf = true;
        for f in frags {
            let h = Header::parse(f, true).unwrap();
            assert_eq!(
                usize::from(h.frag_offset) * 8,
                payload.len(),
                "fragments contiguous"
            );
            payload.extend_from_slice(&f[h.header_len..h.total_len]);
            last_mf = h.mf;
        }
        (payload, last_mf)
    }

    fn fragment(p: &[u8], mtu: u16) -> Vec<Vec<u8>> {
        let mut f = Fragmenter::new(p, mtu).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 2000];
        while let Some(n) = f.next_into(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    #[test]
    fn splits_to_the_mtu_on_8_byte_boundaries() {
        let p = ipv4_sized(1500, false);
        let frags = fragment(&p, 1420);
        assert_eq!(frags.len(), 2);
        assert!(frags.iter().all(|f| f.len() <= 1420));
        assert_eq!((frags[0].len() - 20) % 8, 0);
        let (payload, mf) = reassemble(&frags);
        assert_eq!(payload, &p[20..]);
        assert!(!mf);
        for mtu in [68u16, 100, 576, 1279, 1280, 1499] {
            let frags = fragment(&p, mtu);
            assert!(
                frags.iter().all(|f| f.len() <= usize::from(mtu)),
                "mtu {mtu}"
            );
            assert_eq!(reassemble(&frags).0, &p[20..], "mtu {mtu}");
        }
    }

    #[test]
    fn refuses_df_malformed_and_tiny_mtu() {
        assert_eq!(
            Fragmenter::new(&ipv4_sized(1500, true), 1420).unwrap_err(),
            FragError::DontFragment
        );
        assert_eq!(
            Fragmenter::new(&[0x45; 10], 1420).unwrap_err(),
            FragError::Malformed
        );
        assert_eq!(
            Fragmenter::new(&ipv4_sized(1500, false), 27).unwrap_err(),
            FragError::MtuTooSmall
        );
    }

    #[test]
    fn fragments_reaching_past_the_largest_datagram_are_refused() {
        // The last possible offset (8191 * 8 = 65528) with 1500 bytes would end at 67008.
        let mut p = ipv4_sized(1500, false);
        p[6..8].copy_from_slice(&8191u16.to_be_bytes());
        ipv4::fill_header_checksum(&mut p, 20);
        assert_eq!(Fragmenter::new(&p, 1000).err(), Some(FragError::Malformed));
        // A datagram of exactly 65,535 bytes is fine, and no piece's offset spills into the
        // flags.
        let payload = 65_535 - 20 - 8000 * 8;
        let mut p = ipv4_sized(20 + payload, false);
        p[6..8].copy_from_slice(&8000u16.to_be_bytes());
        ipv4::fill_header_checksum(&mut p, 20);
        for f in fragment(&p, 576) {
            let h = Header::parse(&f, true).unwrap();
            assert!(!h.df);
            assert!(usize::from(h.frag_offset) * 8 + h.total_len - h.header_len <= 65_535);
        }
    }

    #[test]
    fn fragments_of_fragments_keep_offsets_and_more_fragments() {
        // A middle fragment (offset 185 * 8, MF set) of 1500 bytes refragmented to 1000.
        let mut p = ipv4_sized(1500, false);
        p[6..8].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
        ipv4::fill_header_checksum(&mut p, 20);
        let frags = fragment(&p, 1000);
        let heads: Vec<Header> = frags
            .iter()
            .map(|f| Header::parse(f, true).unwrap())
            .collect();
        assert_eq!(heads[0].frag_offset, 185);
        assert!(
            heads.iter().all(|h| h.mf),
            "the original was not the last fragment"
        );
    }

    #[test]
    fn only_copied_options_repeat() {
        // Header with options: a copied one (type 0x83, loose source route, len 7) and a
        // non-copied one (type 0x07, record route, len 7), padded to 16 bytes of options.
        let base = ipv4_sized(1000, false);
        let mut p = Vec::new();
        p.extend_from_slice(&base[..20]);
        p.extend_from_slice(&[0x83, 7, 4, 1, 2, 3, 4, 0x07, 7, 4, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&base[20..]);
        p[0] = 0x49; // IHL 9
        let total = u16::try_from(p.len()).unwrap();
        p[2..4].copy_from_slice(&total.to_be_bytes());
        ipv4::fill_header_checksum(&mut p, 36);
        let frags = fragment(&p, 500);
        assert_eq!(Header::parse(&frags[0], true).unwrap().header_len, 36);
        let later = Header::parse(&frags[1], true).unwrap();
        assert_eq!(
            later.header_len, 28,
            "20 + the 7-byte copied option padded to 8"
        );
        assert_eq!(frags[1][20], 0x83);
        assert_eq!(reassemble(&frags).0, &p[36..]);
    }
}
