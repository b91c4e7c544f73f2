//! One shard's frames to other hosts (docs/adr/0005-server-ids-across-hosts.md §4),
//! sealed as its batch is routed and sent at the batch's end: one sendmmsg(2) per
//! peer, whose messages are GSO trains (UDP_SEGMENT, udp(7)) of equal-sized frames,
//! so that a train crosses both hosts' stacks once (the peer socket reads it whole
//! with UDP_GRO) and pays one route lookup. [`plan`] cuts a peer's frames into
//! trains; `Peers::forward` fills, `Peers::flush` sends (crate::dataplane::peers).
//!
//! Nothing is allocated per frame once the buffers have grown to a batch's size.

use socket2::SockAddr;
use sys::mmsg::SendMmsg;

/// Frames a batch holds before `Peers::forward` flushes it. Frames of two shards to one
/// peer interleave by at most this many sequence numbers, far inside the receiver's
/// replay window (proto::peer::window, 1024).
pub const MAX_FRAMES: usize = 256;
/// Datagrams one GSO send carries: the kernel's UDP_MAX_SEGMENTS is 64 on older
/// kernels (128 since 6.x).
pub const MAX_SEGMENTS: usize = 64;
/// Bytes one GSO send carries: an IPv4 datagram's largest UDP payload is 65 507.
pub const MAX_TRAIN_BYTES: usize = 65_000;

/// A run of one peer's frames sent as one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Train {
    /// Index of its first frame.
    pub first: usize,
    pub frames: usize,
    /// Offset of its first byte in the peer's buffer, and its length.
    pub offset: usize,
    pub bytes: usize,
    /// UDP_SEGMENT: `Some(size)` when it holds more than one frame.
    pub segment: Option<u16>,
}

/// Cuts frames of lengths `lens` (back to back in one buffer, in this order) into
/// trains the kernel splits back into exactly these frames: every frame of a train
/// but the last has the train's segment size, the last is at most that (udp(7)
/// UDP_SEGMENT), at most `max_segments` frames and `max_bytes` bytes a train. A
/// frame too long to be a segment (≥ 2^16, or ≥ `segment_below`: the kernel refused
/// trains of such frames) goes alone.
pub fn plan(lens: &[usize], max_segments: usize, max_bytes: usize, segment_below: usize, out: &mut Vec<Train>) {
    out.clear();
    let (mut i, mut offset) = (0, 0);
    while i < lens.len() {
        let size = lens[i];
        let (mut frames, mut bytes) = (1, size);
        if size > 0 && size <= usize::from(u16::MAX) && size < segment_below {
            while let Some(&next) = lens.get(i + frames) {
                // A shorter frame ends the train (only the last may be shorter).
                if frames >= max_segments || bytes + next > max_bytes || next > size || next == 0 {
                    break;
                }
                frames += 1;
                bytes += next;
                if next < size {
                    break;
                }
            }
        }
        let segment = (frames > 1).then_some(size as u16);
        out.push(Train { first: i, frames, offset, bytes, segment });
        i += frames;
        offset += bytes;
    }
}

/// One peer's frames in this batch.
pub(crate) struct Dest {
    pub host: u16,
    pub addr: std::net::SocketAddr,
    pub to: SockAddr,
    /// The frames, back to back.
    pub bytes: Vec<u8>,
    pub lens: Vec<usize>,
}

/// A shard's frames to other hosts, waiting for the end of its batch.
pub struct PeerOut {
    /// The peers written to since the last flush come first (`used` of them); the
    /// rest keep their buffers for the next batches.
    pub(crate) dests: Vec<Dest>,
    pub(crate) used: usize,
    pub(crate) frames: usize,
    pub(crate) send: SendMmsg,
    pub(crate) trains: Vec<Train>,
}

impl Default for PeerOut {
    fn default() -> PeerOut {
        PeerOut::new()
    }
}

impl PeerOut {
    pub fn new() -> PeerOut {
        PeerOut { dests: Vec::new(), used: 0, frames: 0, send: SendMmsg::new(MAX_FRAMES, 1), trains: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    pub fn is_full(&self) -> bool {
        self.frames >= MAX_FRAMES
    }

    /// The buffer of frames to `host` at `to` (a peer that moved starts a new one).
    pub(crate) fn dest(&mut self, host: u16, to: std::net::SocketAddr) -> &mut Dest {
        let at = self.dests[..self.used].iter().position(|d| d.host == host && d.addr == to);
        let i = match at {
            Some(i) => i,
            None => {
                if self.used == self.dests.len() {
                    self.dests.push(Dest { host, addr: to, to: to.into(), bytes: Vec::new(), lens: Vec::new() });
                } else {
                    let d = &mut self.dests[self.used];
                    (d.host, d.addr, d.to) = (host, to, to.into());
                }
                self.used += 1;
                self.used - 1
            }
        };
        &mut self.dests[i]
    }

    /// Forgets the batch's frames, keeping the buffers.
    pub(crate) fn clear(&mut self) {
        for d in &mut self.dests[..self.used] {
            d.bytes.clear();
            d.lens.clear();
        }
        self.used = 0;
        self.frames = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::{plan, Train};
    use proptest::prelude::*;

    /// What the kernel does with a train: datagrams of `segment` bytes, the last
    /// the remainder (udp(7) UDP_SEGMENT); a message without one is one datagram.
    fn split(t: &Train) -> Vec<usize> {
        match t.segment {
            None => vec![t.bytes],
            Some(s) => {
                let s = usize::from(s);
                (0..t.bytes.div_ceil(s)).map(|k| s.min(t.bytes - k * s)).collect()
            }
        }
    }

    #[test]
    fn equal_frames_go_in_trains_of_at_most_max_segments() {
        let mut out = Vec::new();
        plan(&[1300; 130], 64, 65_000, usize::MAX, &mut out);
        let shape: Vec<(usize, usize, Option<u16>)> = out.iter().map(|t| (t.first, t.frames, t.segment)).collect();
        // 50 × 1300 = 65 000 bytes fills a train before 64 segments do.
        assert_eq!(shape, vec![(0, 50, Some(1300)), (50, 50, Some(1300)), (100, 30, Some(1300))]);
        plan(&[100; 70], 64, 65_000, usize::MAX, &mut out);
        let shape: Vec<(usize, usize)> = out.iter().map(|t| (t.first, t.frames)).collect();
        assert_eq!(shape, vec![(0, 64), (64, 6)]);
    }

    #[test]
    fn a_shorter_frame_ends_a_train_and_a_longer_one_starts_one() {
        let mut out = Vec::new();
        plan(&[1300, 1300, 900, 1300, 1400, 1400, 7], 64, 65_000, usize::MAX, &mut out);
        let shape: Vec<(usize, usize, usize, Option<u16>)> =
            out.iter().map(|t| (t.first, t.frames, t.offset, t.segment)).collect();
        assert_eq!(
            shape,
            vec![(0, 3, 0, Some(1300)), (3, 1, 3500, None), (4, 3, 4800, Some(1400))],
            "the 900 closes the first train; 1300 then 1400: a longer frame cannot follow"
        );
        plan(&[], 64, 65_000, usize::MAX, &mut out);
        assert!(out.is_empty());
        plan(&[70_000, 10], 64, 65_000, usize::MAX, &mut out);
        assert_eq!(out.iter().map(|t| t.segment).collect::<Vec<_>>(), vec![None, None], "too long for a segment");
        // Trains of 1300-byte frames were refused: those go alone, smaller ones still in trains.
        plan(&[1300, 1300, 1299, 1299, 1299], 64, 65_000, 1300, &mut out);
        let shape: Vec<(usize, Option<u16>)> = out.iter().map(|t| (t.frames, t.segment)).collect();
        assert_eq!(shape, vec![(1, None), (1, None), (3, Some(1299))]);
    }

    proptest! {
        /// The trains, split as the kernel splits them, give back exactly the frames,
        /// in order; offsets are contiguous; no train breaks a limit.
        #[test]
        fn trains_split_back_into_the_frames(
            lens in proptest::collection::vec(prop_oneof![1usize..40, Just(1300usize), Just(1200usize)], 0..300),
            max_segments in 1usize..70,
            max_bytes in 1usize..70_000,
            segment_below in prop_oneof![Just(usize::MAX), 1usize..1400],
        ) {
            let mut out = Vec::new();
            plan(&lens, max_segments, max_bytes, segment_below, &mut out);
            let mut back = Vec::new();
            let (mut first, mut offset) = (0, 0);
            for t in &out {
                prop_assert_eq!((t.first, t.offset), (first, offset));
                prop_assert_eq!(t.bytes, lens[t.first..t.first + t.frames].iter().sum::<usize>());
                if t.frames > 1 {
                    prop_assert!(t.frames <= max_segments && t.bytes <= max_bytes);
                    prop_assert!(usize::from(t.segment.unwrap()) < segment_below);
                }
                back.extend(split(t));
                first += t.frames;
                offset += t.bytes;
            }
            prop_assert_eq!(back, lens);
        }
    }
}
