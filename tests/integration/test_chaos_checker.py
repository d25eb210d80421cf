"""The chaos campaign's checker (chaos.check) fed histories made by hand: a clean one, which
it must accept, and one per violation it looks for, planted, which it must report, counted
and with the offending IDs. A checker that never fails would make every campaign pass; this
proves it can fail. No server, no registry: it runs in well under a second.

A history is what the campaign's writers record (chaos.Writer.record): for each
acknowledged request its send and acknowledgement times, its session (a backend of one
incarnation of a node) and its IDs."""

import unittest

import chaos
from fixtures.ids import TWITTER_EPOCH_MS

DC = 7
MS0 = 1_800_000_000_000  # the first IDs' Unix milliseconds
S = 1_000_000_000        # a second in the writers' monotonic nanoseconds


def id_of(ms, worker, seq, dc=DC):
    """An ID in the layout chaos.decode reads (Twitter's epoch)."""
    return ((ms - TWITTER_EPOCH_MS) << 22) | (dc << 17) | (worker << 12) | seq


class History:
    """A schedule that was never played (chaos.Schedule builds no server until run()), with
    nodes, sessions and writers whose requests the test records."""

    def __init__(self):
        self.s = chaos.Schedule(chaos.Plan(1, 0, "redis", nodes=2, seconds=10.0),
                                verbose=False)
        self.t0 = self.s.t0_ns
        self.writers = {}

    def writer(self, node_name, session=0):
        """The writer of `node_name`'s session number `session` (each a connection of its
        own; a new session of the same node is a reconnection or a restart)."""
        key = (node_name, session)
        if key not in self.writers:
            n = self.s.nodes.get(node_name)
            if n is None:
                n = self.s.nodes[node_name] = chaos.Node(node_name, cluster=None)
            w = chaos.Writer(self.s, n, len(n.writers), seed=0)
            w.sess = self.s.new_session(n, w.label, 1000 + len(self.s.sessions))
            w.first_t = self.t0
            n.writers.append(w)
            self.writers[key] = w
        return self.writers[key]

    def ack(self, node_name, sent_s, ack_s, op, got, session=0):
        """Records a request of that session sent and acknowledged at these seconds after
        the start: `got` is the IDs (next, batch), the first of a block of 8 (block) or the
        firsts of blocks of 4096 (ahead)."""
        self.writer(node_name, session).record(
            self.t0 + int(sent_s * S), self.t0 + int(ack_s * S), op, got)

    def check(self):
        return chaos.check(self.s)


def clean():
    """Two nodes on workers 1 and 2 for a while, then worker 1 handed from n1 to n2 (n2's
    IDs on it later and higher), every kind of request; nothing wrong."""
    h = History()
    for k in range(20):
        t = 0.1 * k
        h.ack("n1", t, t + 0.01, "next", [id_of(MS0 + 10 * k, 1, 0)])
        h.ack("n2", t, t + 0.02, "batch", [id_of(MS0 + 10 * k, 2, q) for q in range(50)])
    h.ack("n1", 2.1, 2.11, "block", id_of(MS0 + 300, 1, 0))
    h.ack("n1", 2.2, 2.25, "ahead", [id_of(MS0 + 310, 1, 0), id_of(MS0 + 311, 1, 0)])
    # n1 goes; n2 reconnects with worker 1 after n1's last acknowledgement, above its IDs.
    h.ack("n2", 3.0, 3.01, "next", [id_of(MS0 + 400, 1, 0)], session=1)
    h.ack("n2", 3.1, 3.11, "block", id_of(MS0 + 410, 1, 0), session=1)
    return h


FOUND = ("duplicates", "session_order_violations", "overlap_violations")


class ChaosChecker(unittest.TestCase):

    def assert_found(self, result, **counts):
        """The checker found exactly these violations (none: the history passes)."""
        want = dict.fromkeys(FOUND, 0)
        want.update(counts)
        self.assertEqual({k: result[k] for k in FOUND}, want, chaos.human(result))
        self.assertEqual(result["ok"], not counts)

    def test_a_clean_history_passes(self):
        result = clean().check()
        self.assert_found(result)
        self.assertEqual(result["node_order_regressions"], {})
        # Every ID was looked at: 20 + 20 * 50 + 8 + 2 * 4096 + 1 + 8.
        self.assertEqual(result["ids_checked"], 20 + 1000 + 8 + 8192 + 1 + 8)
        self.assertEqual(result["worker_ids_used"], {f"{DC}/1": ["n1", "n2"], f"{DC}/2": ["n2"]})

    def test_an_id_acknowledged_twice_across_nodes(self):
        h = clean()
        # n2 gets one of n1's IDs while n1's request was still open (so that no real-time
        # order is broken, only uniqueness).
        h.ack("n2", 0.3, 0.32, "next", [id_of(MS0 + 30, 1, 0)], session=2)
        result = h.check()
        self.assert_found(result, duplicates=1)
        self.assertEqual(result["duplicates_across_nodes"], 1)
        example = result["duplicate_examples"][0]
        self.assertTrue(example["id"].startswith(f"{id_of(MS0 + 30, 1, 0)} "), example)
        self.assertEqual({o["node"] for o in example["origins"]}, {"n1", "n2"})

    def test_blocks_overlapping_within_a_node(self):
        h = clean()
        # A block of 8 that starts 5 IDs into n1's block at MS0 + 300, from a new session of
        # n1 (a restart that reissued them), its request overlapping n1's first one.
        h.ack("n1", 2.1, 2.12, "block", id_of(MS0 + 300, 1, 5), session=1)
        result = h.check()
        self.assert_found(result, duplicates=3)  # seq 5, 6, 7
        self.assertEqual(result["duplicates_across_nodes"], 0)
        self.assertEqual(result["duplicate_examples"][0]["count"], 3)

    def test_a_session_going_backwards(self):
        h = clean()
        # n2's first session, after its last batch (MS0 + 190), gets an ID of MS0 + 185 on
        # its own worker (2): no ID repeats, but the session saw its IDs decrease.
        h.ack("n2", 2.5, 2.51, "next", [id_of(MS0 + 185, 2, 60)])
        result = h.check()
        self.assert_found(result, session_order_violations=1)
        example = result["session_order_examples"][0]
        self.assertTrue(example["then"].startswith(f"{id_of(MS0 + 185, 2, 60)} "), example)
        self.assertEqual(example["session"][0], "n2")

    def test_a_worker_id_held_by_two_nodes_at_once(self):
        h = clean()
        # n1 acknowledged worker 1's IDs up to MS0 + 311 by 2.25 s; n2 asks at 2.5 s and gets
        # a lower, unused one on worker 1: it issued from an id n1 held (or from a wrong
        # floor). No duplicate, no session going backwards: only the real-time order.
        h.ack("n2", 2.5, 2.51, "next", [id_of(MS0 + 305, 1, 0)], session=3)
        result = h.check()
        self.assert_found(result, overlap_violations=1)
        example = result["overlap_examples"][0]
        self.assertEqual((example["earlier"]["node"], example["later"]["node"]), ("n1", "n2"))

    def test_a_node_going_backwards_across_its_sessions_is_reported_not_failed(self):
        h = clean()
        # A new session of n2 (after a restart) below what n2's first session got on worker
        # 2: informational (a clock step back that the extension waits out per worker is
        # checked by (c) across nodes), so it is reported and the run still passes.
        h.ack("n2", 2.5, 2.51, "next", [id_of(MS0 + 185, 2, 60)], session=4)
        result = h.check()
        self.assertEqual(result["node_order_regressions"], {"n2": 1})
        self.assert_found(result)

    def test_every_violation_at_once(self):
        h = clean()
        h.ack("n2", 0.3, 0.32, "next", [id_of(MS0 + 30, 1, 0)], session=2)
        h.ack("n2", 2.5, 2.51, "next", [id_of(MS0 + 185, 2, 60)])
        h.ack("n2", 2.5, 2.51, "next", [id_of(MS0 + 305, 1, 0)], session=3)
        result = h.check()
        self.assert_found(result, duplicates=1, session_order_violations=1, overlap_violations=1)
        # The report a campaign prints says so.
        self.assertIn("FOUND PROBLEMS", chaos.human(result))
        self.assertNotIn("FOUND PROBLEMS", chaos.human(clean().check()))

    def test_time_spent_refusing_is_measured(self):
        h = clean()
        # One refusal (55000) of n1 between its acknowledgements at 0.91 s and 1.01 s: the
        # node refused for that 0.1 s (a figure, not a violation).
        w = h.writer("n1")
        w.err_t.append(h.t0 + int(0.95 * S))
        w.errors["55000"] += 1
        result = h.check()
        self.assert_found(result)
        self.assertEqual(result["refusing"]["n1"], {"seconds": 0.1, "longest": 0.1})
        self.assertEqual(result["refusing"]["n2"], {"seconds": 0.0, "longest": 0.0})
        self.assertEqual(result["errors"]["n1"], {"55000": 1})


if __name__ == "__main__":
    unittest.main()
