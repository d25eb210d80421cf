//! The registry's decisions, one copy for every store (issue 37): which id a claim gets,
//! whether a renewal keeps its claim, whether a release counts. Each store reads what it keeps
//! of one datacenter (a transaction of the coordinator, a snapshot of etcd, a script's read
//! of the Redis keys), asks here, and writes the result only if what it read is unchanged
//! (the coordinator's row locks, etcd's compare-and-swap, a Redis script that compares the
//! id's claim and, for a claim, the datacenter's version); the claim simulator's registry
//! asks the same functions. What stays in each store is how it keeps and reads its records,
//! its clock, and when it began (the settle, [`crate::claim::ClaimTiming::settle_wait_ms`]
//! from its birth).

use crate::claim::{self, ClaimChoice, Granted};
use crate::protocol::{ClaimReply, ClaimRequest, RenewReply};

/// A live (unexpired) claim of one id, as a registry read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveClaim<'a> {
    /// The id.
    pub worker_id: u8,
    /// The holder's token.
    pub holder: &'a str,
    /// Written before the registry's latest loss of data (etcd, whose restores give no
    /// sign but revisions): a restore may have brought it back after it had lapsed and gone
    /// to another server, so for a claim it counts as another server's, and its holder keeps
    /// it only by re-asserting within its fence.
    pub from_before_loss: bool,
    /// The holder's `claim_ttl` (ms), where recorded.
    pub holder_ttl_ms: Option<u64>,
    /// The floor handed to the holder (Unix ms).
    pub floor_unix_ms: Option<i64>,
    /// The id's high-water mark (Unix ms).
    pub high_water_unix_ms: Option<i64>,
}

/// What a claim gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Nothing yet: the registry settles for this long (ms).
    Settling {
        /// ms.
        wait_ms: u64,
    },
    /// Nothing: another holder's `claim_ttl` is out of ratio ([`claim::ttl_mismatch`]).
    TtlMismatch {
        /// The other holders' smallest `claim_ttl` (ms).
        others_min_ms: u64,
        /// Their largest (ms).
        others_max_ms: u64,
    },
    /// Hold this id again: this server's token holds it. Its floor is kept.
    Own {
        /// The id.
        worker_id: u8,
        /// The floor recorded for the holder.
        floor_unix_ms: Option<i64>,
        /// The id's mark before this write, up to which a holder of the same token may
        /// have issued.
        inherited_unix_ms: Option<i64>,
    },
    /// Hold this free id, from [`claim::free_grant_floor_unix_ms`] of its marks.
    Free {
        /// The id.
        worker_id: u8,
    },
    /// Every id asked for is held by another server.
    Exhausted {
        /// How many were asked for.
        taken: u32,
    },
}

impl ClaimDecision {
    /// The reply: for a grant, from a store whose grants wait `quarantine_ms` before use,
    /// and for a free id, with the floor `free_floor_unix_ms` its marks give.
    pub fn reply(self, quarantine_ms: u64, free_floor_unix_ms: Option<i64>) -> ClaimReply {
        match self {
            ClaimDecision::Settling { wait_ms } => ClaimReply::Settling { wait_ms },
            ClaimDecision::TtlMismatch {
                others_min_ms,
                others_max_ms,
            } => ClaimReply::TtlMismatch {
                others_min_ms,
                others_max_ms,
            },
            ClaimDecision::Own {
                worker_id,
                floor_unix_ms,
                inherited_unix_ms,
            } => ClaimReply::Granted {
                worker_id,
                granted: Granted::Own,
                floor_unix_ms,
                quarantine_ms,
                inherited_unix_ms,
            },
            ClaimDecision::Free { worker_id } => ClaimReply::Granted {
                worker_id,
                granted: Granted::Free,
                floor_unix_ms: free_floor_unix_ms,
                quarantine_ms,
                inherited_unix_ms: None,
            },
            ClaimDecision::Exhausted { taken } => ClaimReply::Exhausted { taken },
        }
    }
}

/// The token a claim from before a loss is shown as to [`claim::choose_worker`]: nobody's.
const FROM_BEFORE_THE_LOSS: &str = "\u{0}from before the loss";

/// Decides a claim of `request` among one datacenter's live claims `live`, with the
/// registry settling for `settle_wait_ms` more (0: settled):
/// 1. nothing while the registry settles, not even an id this server's token holds (its
///    records may be a restored copy, where that claim was released or lapsed before another
///    server took the id);
/// 2. nothing beside a holder, on any id of the datacenter, whose `claim_ttl` is out of
///    ratio with this server's ([`claim::ttl_mismatch`]);
/// 3. an id this server's token holds (from this incarnation), first in the request's order;
/// 4. else the first free id in that order.
pub fn decide_claim(
    request: &ClaimRequest,
    settle_wait_ms: u64,
    live: &[LiveClaim<'_>],
) -> ClaimDecision {
    if settle_wait_ms > 0 {
        return ClaimDecision::Settling {
            wait_ms: settle_wait_ms,
        };
    }
    let others: Vec<u64> = live
        .iter()
        .filter(|c| !request.tokens.holds(c.holder))
        .filter_map(|c| c.holder_ttl_ms)
        .collect();
    if let Some((others_min_ms, others_max_ms)) = claim::ttl_mismatch(request.timing(), &others) {
        return ClaimDecision::TtlMismatch {
            others_min_ms,
            others_max_ms,
        };
    }
    let holders: Vec<(u8, &str)> = live
        .iter()
        .map(|c| {
            let shown = if c.from_before_loss {
                FROM_BEFORE_THE_LOSS
            } else {
                c.holder
            };
            (c.worker_id, shown)
        })
        .collect();
    let mine = |t: &str| t != FROM_BEFORE_THE_LOSS && request.tokens.holds(t);
    match claim::choose_worker(&request.order, &holders, mine, 0) {
        ClaimChoice::Own(w) => {
            let own = live.iter().find(|c| c.worker_id == w);
            ClaimDecision::Own {
                worker_id: w,
                floor_unix_ms: own.and_then(|c| c.floor_unix_ms),
                inherited_unix_ms: own.and_then(|c| c.high_water_unix_ms),
            }
        }
        ClaimChoice::Free(w) => ClaimDecision::Free { worker_id: w },
        ClaimChoice::Exhausted(taken) => ClaimDecision::Exhausted { taken },
        ClaimChoice::Settling(wait_ms) => ClaimDecision::Settling { wait_ms },
    }
}

/// Decides a renewal of one id: `live` is its live claim (None: none), `high_water_unix_ms`
/// its mark, `may_reassert` whether the holder may take back a claim the registry lost
/// ([`claim::ClaimTiming::may_reassert`], from the birth it knows and the registry's).
/// Renewed (the store then holds the id for the request's token) when this server's token
/// holds it in this incarnation, or when the claim is gone, or from before a loss, and the
/// holder may re-assert it; else lost, naming the other holder.
pub fn decide_renew(
    request: &ClaimRequest,
    live: Option<&LiveClaim<'_>>,
    high_water_unix_ms: Option<i64>,
    may_reassert: bool,
) -> RenewReply {
    let renewed = RenewReply::Renewed {
        inherited_unix_ms: high_water_unix_ms,
    };
    match live {
        Some(c) if request.tokens.holds(c.holder) && !c.from_before_loss => renewed,
        Some(c) if request.tokens.holds(c.holder) => {
            if may_reassert {
                renewed
            } else {
                RenewReply::Lost { holder: None }
            }
        }
        None if may_reassert => renewed,
        Some(c) => RenewReply::Lost {
            holder: Some(c.holder.to_string()),
        },
        None => RenewReply::Lost { holder: None },
    }
}

/// Whether a release by `tokens` ends the live claim whose holder is `holder` (None: no live
/// claim, nothing to do). Only the holder's own tokens do; the marks then change by
/// [`crate::kvclaims::Marks::released`].
pub fn release_counts(tokens: &claim::RequestTokens, holder: Option<&str>) -> bool {
    holder.is_some_and(|h| tokens.holds(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::RequestTokens;

    fn request(order: Vec<u8>, ttl_ms: u64) -> ClaimRequest {
        ClaimRequest {
            datacenter_id: 0,
            order,
            tokens: RequestTokens {
                held: vec!["me-1".into(), "me-0".into()],
                write: "me-2".into(),
            },
            ttl_ms,
            sent_unix_ms: 0,
            cap_unix_ms: 5_000,
            epoch_unix_ms: 0,
            fleet_ttl_ms: 0,
        }
    }

    fn live(worker_id: u8, holder: &str) -> LiveClaim<'_> {
        LiveClaim {
            worker_id,
            holder,
            from_before_loss: false,
            holder_ttl_ms: Some(10_000),
            floor_unix_ms: Some(100),
            high_water_unix_ms: Some(200),
        }
    }

    #[test]
    fn settling_grants_nothing_not_even_an_own_claim() {
        let r = request(vec![0, 1], 10_000);
        let d = decide_claim(&r, 700, &[live(0, "me-1")]);
        assert_eq!(d, ClaimDecision::Settling { wait_ms: 700 });
    }

    #[test]
    fn an_own_claim_comes_first_with_its_floor_and_mark() {
        let r = request(vec![0, 1, 2], 10_000);
        let d = decide_claim(&r, 0, &[live(0, "other"), live(2, "me-0")]);
        assert_eq!(
            d,
            ClaimDecision::Own {
                worker_id: 2,
                floor_unix_ms: Some(100),
                inherited_unix_ms: Some(200)
            }
        );
        let d = decide_claim(&r, 0, &[live(0, "other")]);
        assert_eq!(d, ClaimDecision::Free { worker_id: 1 });
        let d = decide_claim(&r, 0, &[live(0, "a"), live(1, "b"), live(2, "c")]);
        assert_eq!(d, ClaimDecision::Exhausted { taken: 3 });
    }

    #[test]
    fn a_claim_from_before_a_loss_is_another_servers_for_a_claim() {
        let r = request(vec![0, 1], 10_000);
        let mut before = live(0, "me-1");
        before.from_before_loss = true;
        assert_eq!(
            decide_claim(&r, 0, &[before]),
            ClaimDecision::Free { worker_id: 1 }
        );
        // Its holder keeps it only by re-asserting.
        assert_eq!(
            decide_renew(&r, Some(&before), Some(9), false),
            RenewReply::Lost { holder: None }
        );
        assert_eq!(
            decide_renew(&r, Some(&before), Some(9), true),
            RenewReply::Renewed {
                inherited_unix_ms: Some(9)
            }
        );
    }

    #[test]
    fn a_holder_out_of_ratio_on_any_id_refuses_the_claim() {
        let r = request(vec![0], 10_000);
        let mut far = live(5, "other");
        far.holder_ttl_ms = Some(30_000);
        assert_eq!(
            decide_claim(&r, 0, &[far]),
            ClaimDecision::TtlMismatch {
                others_min_ms: 30_000,
                others_max_ms: 30_000
            }
        );
        // This server's own claims do not count.
        let mut mine = far;
        mine.holder = "me-2";
        assert_eq!(
            decide_claim(&r, 0, &[mine]),
            ClaimDecision::Free { worker_id: 0 }
        );
    }

    #[test]
    fn a_renewal_keeps_only_its_own_claim_or_a_lost_one_it_may_reassert() {
        let r = request(vec![0], 10_000);
        let renewed = RenewReply::Renewed {
            inherited_unix_ms: Some(7),
        };
        assert_eq!(
            decide_renew(&r, Some(&live(0, "me-0")), Some(7), false),
            renewed
        );
        assert_eq!(decide_renew(&r, None, Some(7), true), renewed);
        assert_eq!(
            decide_renew(&r, None, Some(7), false),
            RenewReply::Lost { holder: None }
        );
        assert_eq!(
            decide_renew(&r, Some(&live(0, "other")), Some(7), true),
            RenewReply::Lost {
                holder: Some("other".into())
            }
        );
        assert!(release_counts(&r.tokens, Some("me-2")));
        assert!(!release_counts(&r.tokens, Some("other")));
        assert!(!release_counts(&r.tokens, None));
    }
}
