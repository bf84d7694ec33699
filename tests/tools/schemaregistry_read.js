// schemaregistry_read: decodes messages the relay produced with Confluent's own JavaScript
// Schema Registry client (@confluentinc/schemaregistry, installed from schemaregistry/'s
// lockfile), which fetches the writer's schema from the registry by the id in each message.
//
//   node schemaregistry_read.js MODULES_DIR URL avro|json [USER:PASSWORD] < consume-output
//
// stdin: `consume --hex` lines; stdout: one line per message, {"id": <id header>, "value":
// <the decoded value as JSON>} (Avro longs come back as numbers, bytes as base64). A message the
// client cannot decode fails the run (exit 1) with its error.
'use strict';
const path = require('path');
const readline = require('readline');
const [modules, url, format, userInfo] = process.argv.slice(2);
const sr = require(path.join(modules, 'node_modules', '@confluentinc', 'schemaregistry'));

const client = new sr.SchemaRegistryClient({
    baseURLs: [url],
    basicAuthCredentials: userInfo ? {credentialsSource: 'USER_INFO', userInfo} : undefined,
});
const Deser = format === 'avro' ? sr.AvroDeserializer : sr.JsonDeserializer;
const deser = new Deser(client, sr.SerdeType.VALUE, {});

const replacer = (k, v) => (typeof v === 'bigint' ? Number(v)
                            : Buffer.isBuffer(v) ? v.toString('base64') : v);

(async () => {
    const rl = readline.createInterface({input: process.stdin});
    for await (const line of rl) {
        if (!line.trim())
            continue;
        const m = JSON.parse(line);
        const id = m.headers && m.headers.id;
        if (m.value_hex === null) {
            console.log(JSON.stringify({id, value: null}));
            continue;
        }
        const value = await deser.deserialize(m.topic, Buffer.from(m.value_hex, 'hex'));
        console.log(JSON.stringify({id, value}, replacer));
    }
})().catch((e) => {
    console.error(`schemaregistry_read: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
});
