//! The little H.264 knowledge the sources need on top of webrtc-rs (which
//! reads Annex-B NAL units and packetises samples): where an access unit
//! ends, and putting the latest SPS/PPS in front of every IDR picture that
//! comes without them, so a viewer who joins late decodes from the next
//! keyframe on.

use bytes::{Bytes, BytesMut};
use webrtc::rtp::packet::Packet;

pub const NAL_SLICE: u8 = 1;
pub const NAL_IDR: u8 = 5;
pub const NAL_SEI: u8 = 6;
pub const NAL_SPS: u8 = 7;
pub const NAL_PPS: u8 = 8;
pub const NAL_AUD: u8 = 9;
pub const NAL_STAP_A: u8 = 24;
pub const NAL_FU_A: u8 = 28;

const START_CODE: [u8; 4] = [0, 0, 0, 1];

pub fn nal_type(header: u8) -> u8 {
    header & 0x1f
}

/// Whether an access unit (Annex-B) is a keyframe a decoder can start from: an IDR
/// picture with its SPS and PPS.
pub fn is_keyframe(unit: &[u8]) -> bool {
    let mut kinds = 0u32;
    for nal in annex_b_nals(unit) {
        if let Some(&header) = nal.first() {
            kinds |= 1 << nal_type(header);
        }
    }
    let needed = (1 << NAL_IDR) | (1 << NAL_SPS) | (1 << NAL_PPS);
    kinds & needed == needed
}

/// The NAL units of an Annex-B stream (start codes of 3 or 4 bytes), without start codes.
pub fn annex_b_nals(stream: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 <= stream.len() {
        if stream[i..i + 3] == [0, 0, 1] {
            starts.push(i + 3);
            i += 3;
        } else {
            i += 1;
        }
    }
    let ends: Vec<usize> = starts
        .iter()
        .skip(1)
        .map(|&next| {
            // The next start code, and a leading zero of a 4-byte one.
            let end = next - 3;
            if end > 0 && stream[end - 1] == 0 {
                end - 1
            } else {
                end
            }
        })
        .chain(std::iter::once(stream.len()))
        .collect();
    starts
        .into_iter()
        .zip(ends)
        .map(move |(start, end)| &stream[start..end.max(start)])
}

/// A slice that starts a picture (`first_mb_in_slice` = 0, whose ue(v)
/// code is the single bit 1). x264's zerolatency tune cuts pictures into
/// several slices, so the slice type alone does not mark a new frame.
fn starts_picture(nal: &[u8]) -> bool {
    nal.get(1).is_some_and(|b| b & 0x80 != 0)
}

/// Groups NAL units into access units (one per picture, Annex-B framed),
/// inserting the cached SPS/PPS before an IDR picture that lacks them.
#[derive(Default)]
pub struct AccessUnits {
    current: BytesMut,
    has_vcl: bool,
    has_sps: bool,
    has_pps: bool,
    sps: Option<Bytes>,
    pps: Option<Bytes>,
    /// IDR pictures that came without parameter sets and got the cached ones.
    pub params_inserted: u64,
}

impl AccessUnits {
    /// Adds one NAL unit (header byte first, no start code); returns the
    /// access unit it completed, if any.
    pub fn push(&mut self, nal: &[u8]) -> Option<Bytes> {
        let &header = nal.first()?;
        let kind = nal_type(header);
        let vcl = kind == NAL_SLICE || kind == NAL_IDR;
        let boundary =
            matches!(kind, NAL_AUD | NAL_SPS | NAL_PPS | NAL_SEI) || (vcl && starts_picture(nal));
        let done = if boundary && self.has_vcl {
            Some(self.take())
        } else {
            None
        };
        match kind {
            NAL_SPS => {
                self.sps = Some(Bytes::copy_from_slice(nal));
                self.has_sps = true;
            }
            NAL_PPS => {
                self.pps = Some(Bytes::copy_from_slice(nal));
                self.has_pps = true;
            }
            NAL_IDR if !(self.has_sps && self.has_pps) => {
                if let (Some(sps), Some(pps)) = (self.sps.clone(), self.pps.clone()) {
                    self.append(&sps);
                    self.append(&pps);
                    self.has_sps = true;
                    self.has_pps = true;
                    self.params_inserted += 1;
                }
            }
            _ => {}
        }
        self.append(nal);
        self.has_vcl |= vcl;
        done
    }

    /// Whether an SPS has been seen (the stream looks like H.264).
    pub fn seen_sps(&self) -> bool {
        self.sps.is_some()
    }

    fn append(&mut self, nal: &[u8]) {
        self.current.extend_from_slice(&START_CODE);
        self.current.extend_from_slice(nal);
    }

    fn take(&mut self) -> Bytes {
        self.has_vcl = false;
        self.has_sps = false;
        self.has_pps = false;
        self.current.split().freeze()
    }
}

/// What an RTP packet's H.264 payload holds.
#[derive(Debug, Default, PartialEq)]
struct PayloadInfo {
    valid: bool,
    idr_start: bool,
    sps: Option<Bytes>,
    pps: Option<Bytes>,
}

fn inspect(payload: &Bytes) -> PayloadInfo {
    let mut info = PayloadInfo::default();
    let Some(&header) = payload.first() else {
        return info;
    };
    if header & 0x80 != 0 {
        return info; // forbidden_zero_bit
    }
    let single = |nal: Bytes, info: &mut PayloadInfo| match nal.first().map(|h| nal_type(*h)) {
        Some(NAL_SPS) => info.sps = Some(nal),
        Some(NAL_PPS) => info.pps = Some(nal),
        Some(NAL_IDR) => info.idr_start = true,
        _ => {}
    };
    match nal_type(header) {
        1..=23 => {
            info.valid = true;
            single(payload.clone(), &mut info);
        }
        NAL_STAP_A => {
            let mut at = 1;
            while at + 2 <= payload.len() {
                let len = usize::from(u16::from_be_bytes([payload[at], payload[at + 1]]));
                at += 2;
                if len == 0 || at + len > payload.len() {
                    return PayloadInfo::default();
                }
                single(payload.slice(at..at + len), &mut info);
                at += len;
            }
            info.valid = at == payload.len();
        }
        NAL_FU_A => {
            let Some(&fu) = payload.get(1) else {
                return info;
            };
            info.valid = true;
            info.idr_start = fu & 0x80 != 0 && nal_type(fu) == NAL_IDR;
        }
        _ => {}
    }
    info
}

/// Forwards H.264 RTP packets unchanged, except that an IDR picture the
/// source sent without parameter sets gets a STAP-A packet (SPS+PPS, same
/// timestamp) in front; later sequence numbers shift to make room.
#[derive(Default)]
pub struct RtpParams {
    sps: Option<Bytes>,
    pps: Option<Bytes>,
    /// Timestamp of the picture whose parameter sets were last seen.
    params_at: Option<u32>,
    seq_offset: u16,
    pub params_inserted: u64,
}

/// What [`RtpParams::process`] made of a packet.
pub enum Forward {
    /// Not an H.264 payload; dropped.
    Invalid,
    /// Packets to send, in order.
    Packets(Vec<Packet>),
}

impl RtpParams {
    pub fn process(&mut self, mut packet: Packet) -> Forward {
        let info = inspect(&packet.payload);
        if !info.valid {
            return Forward::Invalid;
        }
        let ts = packet.header.timestamp;
        if let Some(sps) = info.sps {
            self.sps = Some(sps);
            self.params_at = Some(ts);
        }
        if let Some(pps) = info.pps {
            self.pps = Some(pps);
            self.params_at = Some(ts);
        }
        let mut out = Vec::with_capacity(2);
        if info.idr_start && self.params_at != Some(ts) {
            if let (Some(sps), Some(pps)) = (&self.sps, &self.pps) {
                let mut payload = BytesMut::with_capacity(5 + sps.len() + pps.len());
                payload.extend_from_slice(&[NAL_STAP_A | (sps[0] & 0x60)]);
                for nal in [sps, pps] {
                    payload.extend_from_slice(&(nal.len() as u16).to_be_bytes());
                    payload.extend_from_slice(nal);
                }
                let mut params = Packet {
                    header: packet.header.clone(),
                    payload: payload.freeze(),
                };
                params.header.marker = false;
                params.header.padding = false;
                params.header.sequence_number =
                    packet.header.sequence_number.wrapping_add(self.seq_offset);
                self.seq_offset = self.seq_offset.wrapping_add(1);
                self.params_at = Some(ts);
                self.params_inserted += 1;
                out.push(params);
            }
        }
        packet.header.sequence_number = packet.header.sequence_number.wrapping_add(self.seq_offset);
        out.push(packet);
        Forward::Packets(out)
    }

    pub fn seen_sps(&self) -> bool {
        self.sps.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use webrtc::rtp::header::Header;

    const SPS: &[u8] = &[0x67, 0x42, 0xc0, 0x1f, 0xaa];
    const PPS: &[u8] = &[0x68, 0xce, 0x3c, 0x80];

    fn idr(first: bool) -> Vec<u8> {
        vec![0x65, if first { 0x88 } else { 0x40 }, 1, 2, 3]
    }

    fn slice(first: bool) -> Vec<u8> {
        vec![0x41, if first { 0x9a } else { 0x20 }, 4, 5]
    }

    fn nals(au: &[u8]) -> Vec<u8> {
        // The type of every NAL unit in an Annex-B access unit.
        au.windows(5)
            .filter(|w| w[..4] == START_CODE)
            .map(|w| nal_type(w[4]))
            .collect()
    }

    #[test]
    fn access_units_split_on_pictures_not_slices() {
        let mut aus = AccessUnits::default();
        assert!(aus.push(SPS).is_none());
        assert!(aus.push(PPS).is_none());
        assert!(aus.push(&idr(true)).is_none());
        assert!(
            aus.push(&idr(false)).is_none(),
            "second slice, same picture"
        );
        let first = aus
            .push(&slice(true))
            .expect("a new picture ends the first");
        assert_eq!(nals(&first), vec![7, 8, 5, 5]);
        let second = aus.push(&[0x09, 0xf0]).expect("an AUD ends the second");
        assert_eq!(nals(&second), vec![1]);
        assert_eq!(aus.params_inserted, 0);
        // The first is a keyframe (IDR with its SPS and PPS), the second not.
        assert!(is_keyframe(&first));
        assert!(!is_keyframe(&second));
        let split: Vec<&[u8]> = annex_b_nals(&first).collect();
        assert_eq!(split, [SPS, PPS, &idr(true)[..], &idr(false)[..]]);
        // Three-byte start codes too.
        let short = [0, 0, 1, 0x67, 1, 0, 0, 1, 0x68, 2];
        let split: Vec<&[u8]> = annex_b_nals(&short).collect();
        assert_eq!(split, [&[0x67, 1][..], &[0x68, 2][..]]);
    }

    #[test]
    fn an_idr_without_parameter_sets_gets_the_cached_ones() {
        let mut aus = AccessUnits::default();
        assert!(aus.push(&idr(true)).is_none(), "nothing cached yet");
        let au = aus.push(SPS).expect("picture done");
        assert_eq!(nals(&au), vec![5]);
        aus.push(PPS);
        aus.push(&idr(true));
        aus.push(&slice(true)).expect("picture");
        let au = aus.push(&idr(true)).expect("picture");
        assert_eq!(nals(&au), vec![1]);
        let au = aus.push(&slice(true)).expect("picture");
        assert_eq!(nals(&au), vec![7, 8, 5], "the repeated SPS/PPS came first");
        assert_eq!(aus.params_inserted, 1);
        assert!(aus.seen_sps());
    }

    fn rtp(seq: u16, ts: u32, payload: &[u8]) -> Packet {
        Packet {
            header: Header {
                version: 2,
                sequence_number: seq,
                timestamp: ts,
                payload_type: 96,
                ..Default::default()
            },
            payload: Bytes::copy_from_slice(payload),
        }
    }

    fn forward(params: &mut RtpParams, packet: Packet) -> Vec<(u16, u8)> {
        match params.process(packet) {
            Forward::Invalid => panic!("refused a valid packet"),
            Forward::Packets(p) => p
                .iter()
                .map(|p| (p.header.sequence_number, nal_type(p.payload[0])))
                .collect(),
        }
    }

    #[test]
    fn rtp_idr_without_parameter_sets_gets_a_stap_a_and_numbers_shift() {
        let mut params = RtpParams::default();
        let mut stap = vec![NAL_STAP_A];
        for nal in [SPS, PPS] {
            stap.extend_from_slice(&(nal.len() as u16).to_be_bytes());
            stap.extend_from_slice(nal);
        }
        assert_eq!(forward(&mut params, rtp(10, 0, &stap)), vec![(10, 24)]);
        // The IDR right after its parameter sets passes as is.
        let fu_start = [0x7c, 0x85, 1, 2];
        assert_eq!(forward(&mut params, rtp(11, 0, &fu_start)), vec![(11, 28)]);
        assert_eq!(
            forward(&mut params, rtp(12, 3000, &slice(true))),
            vec![(12, 1)]
        );
        // A later IDR alone: SPS/PPS inserted, numbering shifted by one.
        assert_eq!(
            forward(&mut params, rtp(13, 6000, &fu_start)),
            vec![(13, 24), (14, 28)]
        );
        let fu_end = [0x7c, 0x45, 3];
        assert_eq!(forward(&mut params, rtp(14, 6000, &fu_end)), vec![(15, 28)]);
        assert_eq!(
            forward(&mut params, rtp(u16::MAX, 9000, &slice(true))),
            vec![(0, 1)]
        );
        assert_eq!(params.params_inserted, 1);
    }

    #[test]
    fn non_h264_payloads_are_refused() {
        let mut params = RtpParams::default();
        // A VP8 payload descriptor (X and S bits) and a truncated STAP-A.
        for payload in [
            &[0x90u8, 0x80, 0x12][..],
            &[NAL_STAP_A, 0, 9, 0x67][..],
            &[][..],
        ] {
            assert!(matches!(
                params.process(rtp(1, 0, payload)),
                Forward::Invalid
            ));
        }
        assert!(!params.seen_sps());
    }
}
