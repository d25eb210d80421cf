//! `#[pg_test]`s: run inside a real server that preloads the library with
//! `snowflake.worker_id = 7` and `snowflake.datacenter_id = 3` (see `crate::pg_test`).

use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    use snowflake_core::durable;
    use snowflake_core::layout::{self, TWITTER_EPOCH_MS};

    fn ids(n: i64) -> Vec<i64> {
        Spi::get_one::<Vec<i64>>(&format!(
            "SELECT array_agg(snowflake_next()) FROM generate_series(1, {n})"
        ))
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn next_is_strictly_increasing_and_carries_the_node() {
        let ids = ids(20_000);
        assert_eq!(ids.len(), 20_000);
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        for id in &ids {
            let parts = layout::unpack(*id).unwrap();
            assert_eq!((parts.worker_id, parts.datacenter_id), (7, 3));
        }
        // 20,000 IDs need at least 5 milliseconds of 4,096 each.
        let first = layout::unpack(ids[0]).unwrap().timestamp.0;
        let last = layout::unpack(ids[19_999]).unwrap().timestamp.0;
        assert!(last - first >= 4, "{first}..{last}");
    }

    #[pg_test]
    fn next_is_close_to_the_clock() {
        let drift = Spi::get_one::<f64>(
            "SELECT abs(extract(epoch FROM clock_timestamp() - snowflake_to_timestamp(snowflake_next())))::float8",
        )
        .unwrap()
        .unwrap();
        assert!(drift < 2.0, "drift {drift} s");
    }

    #[pg_test]
    fn decode_fields_and_accessors() {
        // Discord's documented example, decoded with our (Twitter) epoch.
        let row = Spi::get_three::<i64, i32, i32>(
            "SELECT (d).unix_ms, (d).datacenter_id, (d).sequence FROM (SELECT snowflake_decode(175928847299117063) d) s",
        )
        .unwrap();
        assert_eq!(
            row,
            (Some(TWITTER_EPOCH_MS + 41_944_705_796), Some(1), Some(7))
        );
        let worker =
            Spi::get_one::<i32>("SELECT (snowflake_decode(175928847299117063)).worker_id").unwrap();
        assert_eq!(worker, Some(0));
        let text = Spi::get_one::<String>(
            "SELECT snowflake_to_timestamp(1541815603606036480) AT TIME ZONE 'UTC' || ''",
        )
        .unwrap();
        assert_eq!(text.as_deref(), Some("2022-06-28 16:07:40.105"));
    }

    #[pg_test]
    fn decode_is_null_for_null() {
        assert_eq!(
            Spi::get_one::<i64>("SELECT (snowflake_decode(NULL)).unix_ms").unwrap(),
            None
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT snowflake_from_timestamp(NULL)").unwrap(),
            None
        );
    }

    #[pg_test]
    fn from_timestamp_is_the_first_id_of_the_millisecond() {
        let id =
            Spi::get_one::<i64>("SELECT snowflake_from_timestamp('2022-06-28 16:07:40.105999+00')")
                .unwrap()
                .unwrap();
        assert_eq!(id, 1_541_815_603_606_036_480 & !((1 << 22) - 1));
        let round = Spi::get_one::<bool>(
            "SELECT snowflake_to_timestamp(snowflake_from_timestamp('2030-01-02 03:04:05.678+00')) = '2030-01-02 03:04:05.678+00'",
        )
        .unwrap();
        assert_eq!(round, Some(true));
    }

    #[pg_test]
    #[should_panic(expected = "snowflake ID -1 is out of range")]
    fn negative_ids_are_rejected() {
        Spi::run("SELECT snowflake_decode(-1)").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "timestamp out of range for a snowflake ID")]
    fn timestamps_before_the_epoch_are_rejected() {
        Spi::run("SELECT snowflake_from_timestamp('2010-11-04 01:42:54.656+00')").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "timestamp out of range for a snowflake ID")]
    fn timestamps_after_41_bits_are_rejected() {
        Spi::run("SELECT snowflake_from_timestamp('2080-07-10 17:30:30.209+00')").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "timestamp out of range for a snowflake ID")]
    fn infinity_is_rejected() {
        Spi::run("SELECT snowflake_from_timestamp('infinity')").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "cannot be changed without restarting the server")]
    fn worker_id_cannot_be_set_in_a_session() {
        Spi::run("SET snowflake.worker_id = 5").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "cannot be changed without restarting the server")]
    fn epoch_cannot_be_set_in_a_session() {
        Spi::run("SET snowflake.epoch = '2015-01-01 00:00:00+00'").unwrap();
    }

    #[pg_test]
    fn settings_are_visible() {
        let worker = Spi::get_one::<String>("SHOW snowflake.worker_id").unwrap();
        assert_eq!(worker.as_deref(), Some("7"));
        let context = Spi::get_one::<String>(
            "SELECT string_agg(DISTINCT context, ',') FROM pg_settings WHERE name IN ('snowflake.worker_id', 'snowflake.datacenter_id', 'snowflake.epoch', 'snowflake.rmgr_id')",
        )
        .unwrap();
        assert_eq!(context.as_deref(), Some("postmaster"));
    }

    #[pg_test]
    fn first_id_records_the_layout() {
        Spi::run("SELECT snowflake_next()").unwrap();
        let dir = Spi::get_one::<String>("SHOW data_directory")
            .unwrap()
            .unwrap();
        let state = durable::read(std::path::Path::new(&dir)).unwrap().unwrap();
        assert_eq!(state.layout.epoch_ms, TWITTER_EPOCH_MS);
        // The lease covers the ID just issued.
        let last = Spi::get_one::<i64>("SELECT (snowflake_decode(snowflake_next())).unix_ms")
            .unwrap()
            .unwrap();
        let state = durable::read(std::path::Path::new(&dir)).unwrap().unwrap();
        assert!(
            state.lease_end_unix_ms > last,
            "{} <= {last}",
            state.lease_end_unix_ms
        );
        assert_eq!(
            (
                state.layout.timestamp_bits,
                state.layout.datacenter_bits,
                state.layout.worker_bits,
                state.layout.sequence_bits
            ),
            (41, 5, 5, 12)
        );
    }

    #[pg_test]
    fn functions_are_annotated() {
        let rows = Spi::get_one::<String>(
            "SELECT string_agg(DISTINCT proname || ':' || provolatile::text || proparallel::text || proisstrict::text, ' ')
               FROM pg_proc WHERE proname LIKE 'snowflake\\_%' AND proname NOT IN ('snowflake_convert_column', 'snowflake_worker_collisions')",
        )
        .unwrap();
        assert_eq!(
            rows.as_deref(),
            Some(
                "snowflake_decode:istrue snowflake_format:istrue snowflake_from_base32:istrue \
                 snowflake_from_timestamp:istrue snowflake_melt:istrue snowflake_next:vstrue \
                 snowflake_next_batch:vstrue snowflake_next_block:vstrue snowflake_safe_upto:vrtrue \
                 snowflake_serial:istrue snowflake_serial_id:istrue snowflake_stats:vstrue \
                 snowflake_to_base32:istrue snowflake_to_timestamp:istrue"
            )
        );
    }

    #[pg_test]
    fn usable_in_generated_columns_and_indexes() {
        Spi::run(
            "CREATE TEMP TABLE t (
                 id bigint PRIMARY KEY DEFAULT snowflake_next(),
                 created timestamptz GENERATED ALWAYS AS (snowflake_to_timestamp(id)) STORED
             );
             CREATE INDEX ON t (((snowflake_decode(id)).worker_id));
             INSERT INTO t SELECT FROM generate_series(1, 100);",
        )
        .unwrap();
        let n = Spi::get_one::<i64>(
            "SELECT count(*) FROM t WHERE (snowflake_decode(id)).worker_id = 7 AND created <= clock_timestamp() + interval '2 s'",
        )
        .unwrap();
        assert_eq!(n, Some(100));
    }

    #[pg_test]
    fn stats_report_ids_and_the_lease() {
        Spi::run("SELECT snowflake_next() FROM generate_series(1, 1000)").unwrap();
        let (issued, writes, lease_after_last) = Spi::get_three::<i64, i64, bool>(
            "SELECT ids_issued, lease_writes, lease_end > last_issued FROM snowflake_stats",
        )
        .unwrap();
        assert!(issued.unwrap() >= 1000);
        assert!(writes.unwrap() >= 1);
        assert_eq!(lease_after_last, Some(true));
        let node =
            Spi::get_two::<i32, i32>("SELECT worker_id, datacenter_id FROM snowflake_stats()")
                .unwrap();
        assert_eq!(node, (Some(7), Some(3)));
        // A configured worker id: no registry, no claim.
        let claim = Spi::get_three::<String, String, String>(
            "SELECT worker_id_source, registry, claim_status FROM snowflake_stats()",
        )
        .unwrap();
        assert_eq!(claim, (Some("configuration".to_string()), None, None));
    }

    #[pg_test]
    fn lease_is_written_at_most_once_per_window() {
        // 200,000 IDs take about 50 ms at the cap; the default window is 1 s.
        let before = Spi::get_one::<i64>("SELECT lease_writes FROM snowflake_stats")
            .unwrap()
            .unwrap();
        let (first, last) = Spi::get_two::<i64, i64>(
            "SELECT min(x), max(x) FROM (SELECT (snowflake_decode(snowflake_next())).unix_ms x FROM generate_series(1, 200000)) s",
        )
        .unwrap();
        let after = Spi::get_one::<i64>("SELECT lease_writes FROM snowflake_stats")
            .unwrap()
            .unwrap();
        let span_ms = last.unwrap() - first.unwrap();
        assert!(
            after - before <= span_ms / 1000 + 1,
            "{} writes over {span_ms} ms",
            after - before
        );
    }

    #[pg_test]
    fn batch_is_increasing_and_above_earlier_ids() {
        let before = Spi::get_one::<i64>("SELECT snowflake_next()")
            .unwrap()
            .unwrap();
        let batch = Spi::get_one::<Vec<i64>>("SELECT snowflake_next_batch(100000)")
            .unwrap()
            .unwrap();
        assert_eq!(batch.len(), 100_000);
        assert!(batch[0] > before);
        assert!(batch.windows(2).all(|w| w[0] < w[1]));
        let after = Spi::get_one::<i64>("SELECT snowflake_next()")
            .unwrap()
            .unwrap();
        assert!(after > batch[99_999]);
    }

    #[pg_test]
    fn block_is_contiguous_and_reserved() {
        let first = Spi::get_one::<i64>("SELECT snowflake_next_block(4096)")
            .unwrap()
            .unwrap();
        let parts = layout::unpack(first).unwrap();
        assert_eq!(parts.sequence, 0);
        let last = layout::unpack(first + 4095).unwrap();
        assert_eq!((last.timestamp, last.sequence), (parts.timestamp, 4095));
        let next = Spi::get_one::<i64>("SELECT snowflake_next()")
            .unwrap()
            .unwrap();
        assert!(next > first + 4095);
    }

    #[pg_test]
    #[should_panic(expected = "block size 4097 is out of range")]
    fn block_larger_than_a_millisecond_is_rejected() {
        Spi::run("SELECT snowflake_next_block(4097)").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "unknown snowflake layout \"uuid\"")]
    fn unknown_layouts_are_rejected() {
        Spi::run("SELECT snowflake_decode(1, 'uuid')").unwrap();
    }

    #[pg_test]
    fn format_gives_the_id_as_text() {
        let json = Spi::get_one::<pgrx::JsonB>("SELECT snowflake_format(175928847299117063)")
            .unwrap()
            .unwrap();
        assert_eq!(json.0["id"], "175928847299117063");
        assert_eq!(json.0["datacenter_id"], 1);
        assert_eq!(json.0["sequence"], 7);
    }

    #[pg_test]
    fn text_forms_round_trip_generated_ids() {
        let ok = Spi::get_one::<bool>(
            "SELECT bool_and(snowflake_serial_id(snowflake_serial('INV-', id)) = id
                         AND snowflake_from_base32(lower(snowflake_to_base32(id))) = id
                         AND (snowflake_melt(id)).bytes = int8send(id)
                         AND (snowflake_melt(id)).worker_id = 7)
               FROM (SELECT snowflake_next() AS id FROM generate_series(1, 5000)) s",
        )
        .unwrap();
        assert_eq!(ok, Some(true));
    }

    #[pg_test]
    #[should_panic(expected = "invalid snowflake serial: too short")]
    fn short_serials_are_rejected() {
        Spi::run("SELECT snowflake_serial_id('INV-42')").unwrap();
    }

    #[pg_test]
    fn the_watermark_holds_this_transactions_ids() {
        // The test runs in one transaction: its own IDs are in flight.
        let first = Spi::get_one::<i64>("SELECT snowflake_next()")
            .unwrap()
            .unwrap();
        let more = ids(100);
        let upto = Spi::get_one::<i64>("SELECT snowflake_safe_upto()")
            .unwrap()
            .unwrap();
        assert!(upto <= first, "watermark {upto} above held ID {first}");
        assert!(more.iter().all(|&id| id > first));
    }
}
