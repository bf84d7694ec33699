// schema-registry: a stand-in for Confluent's Schema Registry in the tests (none can be installed
// here), as the mock broker stands in for Kafka. It serves the part of the documented REST API
// (https://docs.confluent.io/platform/current/schema-registry/develop/api.html) that the relay
// and Confluent's own JavaScript client use:
//   GET  /subjects                                   the subjects
//   GET  /subjects/{s}/versions                      their versions
//   GET  /subjects/{s}/versions/{latest|N}           {subject, version, id, schema[, schemaType]}
//   GET  /schemas/ids/{id}                           {schema[, schemaType]}
//   POST /subjects/{s}/versions                      register: {id} (same schema: same id)
//   POST /subjects/{s}                               look up a schema under s: {subject, id, ...}
// Errors as Confluent's: 404 {"error_code": 40401 subject | 40402 version | 40403 schema}, 401
// {"error_code": 401} without the right basic-auth credentials, 422 for an invalid body. Schemas
// are not checked for compatibility (not used by the relay). No other dependency than node.
//
//   node schema-registry.js --port N [--auth USER:PASSWORD] [--schemas FILE] [--tls CERT KEY]
//
// --tls: https with that PEM certificate (chain) and key, instead of http.
// FILE: {"subject": [{"schema": "...", "schemaType": "JSON"}, ...], ...}, registered in file
// order (ids 1, 2, ... in that order, so a restart with the same file gives the same ids).
// Prints "listening PORT" once it listens. Stop it (SIGTERM, SIGKILL) to simulate an outage;
// SIGSTOP makes it a registry that accepts connections and never answers; SIGUSR1 toggles a
// failing one that answers every request 503 (as a registry whose Kafka store is down does);
// SIGUSR2 toggles a refused list: GET /subjects answers 403, the rest as before (Confluent's ACL
// authorizer for a user with SUBJECT_READ on its subjects but no GLOBAL_SUBJECTS_READ).
'use strict';
const http = require('http');
const https = require('https');
const fs = require('fs');

const args = process.argv.slice(2);
const opt = (name) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
};
const port = Number(opt('--port') || 0);
const auth = opt('--auth');
const file = opt('--schemas');
const tls = args.indexOf('--tls') >= 0
    ? {cert: fs.readFileSync(opt('--tls')), key: fs.readFileSync(args[args.indexOf('--tls') + 2])}
    : undefined;

const subjects = new Map(); // subject -> [{id, version, schema, schemaType}]
const byId = new Map();     // id -> {schema, schemaType}
let nextId = 1;

function register(subject, schema, schemaType) {
    const type = schemaType && schemaType !== 'AVRO' ? schemaType : undefined;
    let id;
    for (const [k, v] of byId)
        if (v.schema === schema && v.schemaType === type)
            id = k;
    if (id === undefined) {
        id = nextId++;
        byId.set(id, {schema, schemaType: type});
    }
    const versions = subjects.get(subject) || [];
    const same = versions.find((v) => v.id === id);
    if (same)
        return same;
    const entry = {id, version: versions.length + 1, schema, schemaType: type};
    versions.push(entry);
    subjects.set(subject, versions);
    return entry;
}

if (file)
    for (const [subject, list] of Object.entries(JSON.parse(fs.readFileSync(file, 'utf8'))))
        for (const s of list)
            register(subject, s.schema, s.schemaType);

function send(res, status, body) {
    res.writeHead(status, {'Content-Type': 'application/vnd.schemaregistry.v1+json'});
    res.end(JSON.stringify(body));
}

function schemaAnswer(subject, v) {
    const out = {subject, version: v.version, id: v.id, schema: v.schema};
    if (v.schemaType)
        out.schemaType = v.schemaType;
    return out;
}

let failing = false;
process.on('SIGUSR1', () => {
    failing = !failing;
    console.log(failing ? 'failing' : 'answering');
});

let listRefused = false;
process.on('SIGUSR2', () => {
    listRefused = !listRefused;
    console.log(listRefused ? 'list refused' : 'list allowed');
});

const handler = (req, res) => {
    if (failing)
        return send(res, 503, {error_code: 50302, message: 'Service Unavailable'});
    if (auth) {
        const want = 'Basic ' + Buffer.from(auth).toString('base64');
        if (req.headers.authorization !== want)
            return send(res, 401, {error_code: 401, message: 'Unauthorized'});
    }
    let body = '';
    req.on('data', (c) => {
        body += c;
        if (body.length > 1 << 20)
            req.destroy();
    });
    req.on('end', () => {
        const url = new URL(req.url, 'http://x');
        const parts = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
        if (req.method === 'GET' && parts.length === 1 && parts[0] === 'subjects')
            return listRefused
                ? send(res, 403, {error_code: 40301,
                    message: 'User is denied operation Read on Subject: *'})
                : send(res, 200, [...subjects.keys()]);
        if (parts[0] === 'schemas' && parts[1] === 'ids' && parts.length === 3) {
            const s = byId.get(Number(parts[2]));
            if (!s)
                return send(res, 404, {error_code: 40403, message: 'Schema not found'});
            const out = {schema: s.schema};
            if (s.schemaType)
                out.schemaType = s.schemaType;
            return send(res, 200, out);
        }
        if (parts[0] !== 'subjects' || parts.length < 2)
            return send(res, 404, {error_code: 404, message: 'HTTP 404 Not Found'});
        const subject = parts[1];
        const versions = subjects.get(subject);
        let parsed;
        if (req.method === 'POST') {
            try {
                parsed = JSON.parse(body);
            } catch (e) {
                return send(res, 422, {error_code: 42201, message: 'Invalid schema'});
            }
            if (parts.length === 3 && parts[2] === 'versions')
                return send(res, 200, {id: register(subject, parsed.schema, parsed.schemaType).id});
            if (parts.length === 2) {
                if (!versions)
                    return send(res, 404, {error_code: 40401, message: `Subject '${subject}' not found.`});
                const v = versions.find((x) => x.schema === parsed.schema);
                if (!v)
                    return send(res, 404, {error_code: 40403, message: 'Schema not found'});
                return send(res, 200, schemaAnswer(subject, v));
            }
        }
        if (req.method === 'GET' && parts[2] === 'versions') {
            if (!versions)
                return send(res, 404, {error_code: 40401, message: `Subject '${subject}' not found.`});
            if (parts.length === 3)
                return send(res, 200, versions.map((v) => v.version));
            const v = parts[3] === 'latest' ? versions[versions.length - 1]
                                            : versions.find((x) => x.version === Number(parts[3]));
            if (!v)
                return send(res, 404, {error_code: 40402, message: 'Version not found.'});
            return send(res, 200, schemaAnswer(subject, v));
        }
        send(res, 404, {error_code: 404, message: 'HTTP 404 Not Found'});
    });
};
const server = tls ? https.createServer(tls, handler) : http.createServer(handler);
server.listen(port, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
process.on('SIGTERM', () => process.exit(0));
