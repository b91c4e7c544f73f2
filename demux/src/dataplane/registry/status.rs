//! `StatusRequest` on the control socket (`demux lb-status`): the shards' counters,
//! each live instance's counts since its slot was handed to it, rendered by
//! [`crate::dataplane::status`].

use super::Registry;
use crate::dataplane::fast_path;
use crate::dataplane::status::{self, InstanceStatus};

impl Registry {
    pub(super) fn status_json(&self) -> String {
        let snap = self.shared.load();
        let instances: Vec<InstanceStatus> = snap
            .conns
            .iter()
            .zip(snap.table.instances())
            .map(|(c, info)| InstanceStatus {
                server_id: c.server_id,
                placeable: info.placeable,
                counts: self.slots.since_baseline(c.slot, self.slot_counts(c.slot)),
            })
            .collect();
        let fast = fast_path::status_json(&self.fast_path, self.fast_path_mode);
        status::render(&self.info, snap.table.keys(), snap.version, &self.counters, &instances, fast)
    }
}
