// cloudevents_read: turns the messages `consume` printed (JSON lines on stdin) into CloudEvents
// with the official JavaScript SDK's Kafka binding (npm `cloudevents`), and prints one JSON line
// per event: id, type, source, subject, time, specversion, datacontenttype, data. A message the
// SDK cannot read as an event fails the run (exit 1) with the SDK's error.
//   node cloudevents_read.js SDK_DIR < messages.jsonl
'use strict';
const { Kafka } = require(require('path').join(process.argv[2], 'node_modules', 'cloudevents'));
const lines = require('fs').readFileSync(0, 'utf8').split('\n').filter((l) => l.trim());
for (const line of lines) {
    const m = JSON.parse(line);
    const headers = {};
    for (const [name, value] of m.header_list || []) headers[name] = value === null ? '' : value;
    const event = Kafka.toEvent({
        key: m.key,
        value: m.value === null ? null : Buffer.from(m.value),
        headers,
        timestamp: String(m.timestamp_ms),
    });
    const e = Array.isArray(event) ? event[0] : event;
    console.log(JSON.stringify({
        id: e.id, type: e.type, source: e.source, subject: e.subject, time: e.time,
        specversion: e.specversion, datacontenttype: e.datacontenttype, data: e.data,
    }));
}
