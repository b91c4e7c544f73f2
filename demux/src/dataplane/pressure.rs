//! Handshake pressure per instance (docs/operations.md "Liveness and
//! pressure"): each worker reports its handshakes in progress in `Load` (docs/wire.md);
//! the registry turns that into a [`Pressure`] level per instance and publishes it in
//! the snapshot, next to the table. The shard applies it to token-less Initials about
//! to be placed on that instance through [`PressureAdmission`], which wraps the
//! shard's own admission (crate::dataplane::limits): no lock, one slice index.
//!
//! - above `--pressure-retry-above`: answered with a Retry at any rate (the shard's
//!   Minter; the client's next Initial carries a token and is admitted);
//! - above `--pressure-drop-above`: dropped, counted (`refused.Overloaded`).
//!
//! Initials that carry a token, and everything else, pass unchanged. A token-less
//! Initial on a live DCID of a pressured instance that is neither a ClientHello nor a
//! follow-up of a placement is dropped at either level (`owner_initial.dropped_pressure`;
//! crate::dataplane::limits, proto::limits::owner_initial).

use crate::dataplane::limits::Refusal;
use proto::header::LongHeader;
use proto::route::{Admission, LiveInitial, OwnerInitial};
use proto::Table;

/// What a token-less Initial placed on the instance gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pressure {
    /// Admitted as usual (the shard's own Retry rules apply).
    #[default]
    Normal,
    /// Answered with a Retry, at any rate (`--pressure-retry-above`).
    Retry,
    /// Dropped and counted (`--pressure-drop-above`).
    Drop,
}

/// `--pressure-retry-above`, `--pressure-drop-above` (0: off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PressureConfig {
    pub retry_above: u32,
    pub drop_above: u32,
}

impl PressureConfig {
    /// The pressure level of an instance reporting `handshakes` in progress.
    pub fn level(&self, handshakes: u32) -> Pressure {
        if self.drop_above > 0 && handshakes > self.drop_above {
            Pressure::Drop
        } else if self.retry_above > 0 && handshakes > self.retry_above {
            Pressure::Retry
        } else {
            Pressure::Normal
        }
    }
}

/// The shard's admission, with the snapshot's per-instance pressure applied first.
pub struct PressureAdmission<'a, A> {
    pub inner: A,
    /// Indexed like the table's instances (the snapshot's `pressure`).
    pub pressure: &'a [Pressure],
}

impl<A: Admission<Refusal = Refusal>> Admission for PressureAdmission<'_, A> {
    type Refusal = Refusal;

    #[inline]
    fn admit(&mut self, h: &LongHeader<'_>, len: usize, table: &Table, target: usize) -> Result<u32, Refusal> {
        if h.ty == proto::LongType::Initial && h.token.is_empty() {
            match self.pressure.get(target) {
                Some(Pressure::Drop) => return Err(Refusal::Overloaded),
                Some(Pressure::Retry) => return Err(Refusal::Retry { target }),
                _ => {}
            }
        }
        self.inner.admit(h, len, table, target)
    }

    #[inline]
    fn release(&mut self, payload: u32) {
        self.inner.release(payload);
    }

    /// The inner admission decides whether an Initial on a live DCID goes to its
    /// owner (proto::limits::owner_initial); it applies the owner's pressure to the
    /// unproven ones itself (crate::dataplane::limits::ShardAdmission::pressure).
    #[inline]
    fn owner_initial(&mut self, initial: &LiveInitial<'_, '_>, t: &Table) -> OwnerInitial<Refusal> {
        self.inner.owner_initial(initial, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_levels() {
        let p = PressureConfig { retry_above: 10, drop_above: 100 };
        assert_eq!(p.level(0), Pressure::Normal);
        assert_eq!(p.level(10), Pressure::Normal);
        assert_eq!(p.level(11), Pressure::Retry);
        assert_eq!(p.level(100), Pressure::Retry);
        assert_eq!(p.level(101), Pressure::Drop);
        let off = PressureConfig { retry_above: 0, drop_above: 0 };
        assert_eq!(off.level(u32::MAX), Pressure::Normal);
        let drop_only = PressureConfig { retry_above: 0, drop_above: 5 };
        assert_eq!((drop_only.level(5), drop_only.level(6)), (Pressure::Normal, Pressure::Drop));
    }

    /// Only token-less Initials on a pressured instance are refused; the other
    /// instances' and token-carrying ones go to the inner admission.
    #[test]
    fn the_wrapper_applies_the_targets_level_to_token_less_initials_only() {
        use proto::LongType;
        struct Yes;
        impl Admission for Yes {
            type Refusal = Refusal;
            fn admit(&mut self, _: &LongHeader<'_>, _: usize, _: &Table, _: usize) -> Result<u32, Refusal> {
                Ok(7)
            }
            fn release(&mut self, _: u32) {}
        }
        let keys = proto::KeySet::new((proto::Generation::new(0).unwrap(), [1; 32]), None).unwrap();
        let info: Vec<_> =
            (1..=3).map(|i| proto::InstanceInfo { server_id: proto::ServerId(i), placeable: true }).collect();
        let table = Table::new(keys, [2; 16], &info).unwrap();
        let levels = [Pressure::Normal, Pressure::Retry, Pressure::Drop];
        let mut a = PressureAdmission { inner: Yes, pressure: &levels };
        let h = |ty, token| LongHeader { version: 1, ty, dcid: &[1; 8], scid: &[], token, packet_len: 1200 };
        let bare = h(LongType::Initial, &[]);
        assert_eq!(a.admit(&bare, 1200, &table, 0), Ok(7));
        assert_eq!(a.admit(&bare, 1200, &table, 1), Err(Refusal::Retry { target: 1 }));
        assert_eq!(a.admit(&bare, 1200, &table, 2), Err(Refusal::Overloaded));
        assert_eq!(a.admit(&h(LongType::Initial, &[9; 40]), 1200, &table, 2), Ok(7), "a token passes");
        assert_eq!(a.admit(&h(LongType::ZeroRtt, &[]), 1200, &table, 2), Ok(7));
        assert_eq!(a.admit(&bare, 1200, &table, 3), Ok(7), "no level: normal");
    }
}
