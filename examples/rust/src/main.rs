//! Pre-assign snowflake IDs for an order and its lines, write them in one transaction,
//! and read them back joined, with tokio-postgres.
//!
//! Connection string: the first argument, e.g. `host=/var/run/postgresql user=postgres`.

use tokio_postgres::NoTls;

const ITEMS: [&str; 3] = ["100 bolts", "100 nuts", "50 washers"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), tokio_postgres::Error> {
    let conninfo = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "host=localhost user=postgres".to_string());
    let (mut client, connection) = tokio_postgres::connect(&conninfo, NoTls).await?;
    tokio::spawn(connection);

    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text NOT NULL);
             CREATE TABLE IF NOT EXISTS order_lines (
                 id bigint PRIMARY KEY,
                 order_id bigint NOT NULL REFERENCES orders,
                 item text NOT NULL);",
        )
        .await?;

    let tx = client.transaction().await?;
    // One round trip for every ID the transaction needs.
    let ids: Vec<i64> = tx
        .query_one("SELECT snowflake_next_batch($1)", &[&(1 + ITEMS.len() as i32)])
        .await?
        .get(0);
    let (order_id, line_ids) = (ids[0], &ids[1..]);
    tx.execute(
        "INSERT INTO orders (id, customer) VALUES ($1, $2)",
        &[&order_id, &"ACME Corp"],
    )
    .await?;
    for (line_id, item) in line_ids.iter().zip(ITEMS) {
        tx.execute(
            "INSERT INTO order_lines (id, order_id, item) VALUES ($1, $2, $3)",
            &[line_id, &order_id, &item],
        )
        .await?;
    }
    tx.commit().await?;

    let rows = client
        .query(
            "SELECT o.id, l.id, l.item FROM orders o JOIN order_lines l ON l.order_id = o.id
              WHERE o.id = $1 ORDER BY l.id",
            &[&order_id],
        )
        .await?;
    let items: Vec<String> = rows.iter().map(|r| r.get(2)).collect();
    assert_eq!(items, ITEMS, "lines read back in ID order");
    for row in &rows {
        let (order, line): (i64, i64) = (row.get(0), row.get(1));
        assert!(line > order, "details are generated after the master");
        println!("order {order}: line {line} '{}'", row.get::<_, String>(2));
    }
    Ok(())
}
