// snowflake IDs in Node.js with the npm `pg` driver.
//
// node-postgres returns bigint (int8) columns as strings, because a JavaScript number holds
// integers exactly only up to 2^53 and snowflake IDs are far above it. Keep them as strings,
// or turn them into BigInt; never into Number. For JSON, send strings: JSON.stringify cannot
// write a BigInt, and JSON numbers above 2^53 are rounded by JavaScript parsers.
//
// Connection: the usual libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE).
//   npm ci && node index.js
'use strict';
const { Client, types } = require('pg');

async function main() {
  const client = new Client();
  await client.connect();
  try {
    await client.query(`CREATE TABLE IF NOT EXISTS notes (
                          id   bigint PRIMARY KEY DEFAULT snowflake_next(),
                          body text NOT NULL)`);

    // 1. The default: the ID arrives as a string, exactly.
    const inserted = await client.query(
      'INSERT INTO notes (body) VALUES ($1) RETURNING id', ['hello from Node']);
    const idText = inserted.rows[0].id;

    // 2. BigInt: exact arithmetic and comparison; pass it back as a string parameter.
    const id = BigInt(idText);
    const sequence = Number(id & 0xFFFn);            // low 12 bits: small, safe as Number
    const unixMs = Number((id >> 22n) + 1288834974657n); // the default (Twitter) epoch
    const back = await client.query('SELECT body FROM notes WHERE id = $1', [id.toString()]);

    // What Number would do: above 2^53 doubles are 256 apart at this size (2^60 to 2^61), so ten
    // consecutive IDs collapse onto one or two numbers.
    const tenIds = Array.from({ length: 10 }, (_, k) => id + BigInt(k));
    const distinctAsNumber = new Set(tenIds.map((x) => Number(x))).size;

    // 3. JSON: snowflake_format() gives the ID as a string and the time in RFC 3339.
    const formatted = (await client.query('SELECT snowflake_format($1) AS f', [idText])).rows[0].f;

    // 4. Or have every int8 column parsed as BigInt (for this process).
    types.setTypeParser(types.builtins.INT8, (text) => BigInt(text));
    const parsed = (await client.query('SELECT id FROM notes WHERE id = $1', [idText])).rows[0].id;

    console.log(JSON.stringify({
      id: idText,
      typeofDefault: typeof idText,
      bigint: id.toString(),
      typeofParsed: typeof parsed,
      parsedEqual: parsed === id,
      sequence,
      unixMs,
      body: back.rows[0].body,
      distinctAsNumber,
      formatted,
    }));
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
