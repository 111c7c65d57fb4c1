#!/usr/bin/env node
// node-retry is a complete kds-host RetryForcer plugin in Node.js. It speaks go-plugin's protocol
// by hand, as docs/plugin-protocol.md describes it: the magic cookie, version negotiation, the
// handshake line on stdout, AutoMTLS, the health service, GRPCController/Shutdown and hclog JSON
// lines on stderr. Its policy: the same delay every round, a give-up after maxAttempts rounds (0:
// never), INVALID names put in hold (the host parks them) once the zone refused the same content
// as INVALID invalidAttempts times in a row, and no delay over the host's max_delay.
//
//   delay: 250ms
//   maxAttempts: 0
//   invalidAttempts: 3
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const forge = require('node-forge');
const YAML = require('yaml');

const NAME = 'node-retry';
const VERSION = '1.0.0';
const SAMPLE_CONFIG = 'delay: 250ms\nmaxAttempts: 0\ninvalidAttempts: 3\n';

// Protocol §1: the magic cookie and the protocol version (shared.Handshake in the Go code).
const COOKIE_KEY = 'KDS_HOST_PLUGIN';
const COOKIE_VALUE = '6f1d8c0e-kds-host-plugin-protocol';
const CORE_PROTOCOL = 1; // go-plugin's own protocol
const APP_PROTOCOL = 1; // kds-host plugin protocol (plugin.v1)

// Protocol §6: hclog JSON lines on stderr reach the host's log at their level. The timestamp
// must have exactly six fractional digits, or the host shows the line raw.
function log(level, message, fields = {}) {
  const ts = new Date().toISOString().replace(/Z$/, '000Z');
  process.stderr.write(JSON.stringify({ '@level': level, '@message': message, '@module': NAME, '@timestamp': ts, ...fields }) + '\n');
}

// Durations: Go's syntax (250ms, 1.5s, 1m30s), held as BigInt nanoseconds.
const UNITS = { ns: 1n, us: 1000n, 'µs': 1000n, ms: 1000000n, s: 1000000000n, m: 60000000000n, h: 3600000000000n };

function parseDuration(text) {
  if (typeof text !== 'string' || !/^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/.test(text)) {
    throw new Error(`want a duration such as 250ms or 1.5s, got ${JSON.stringify(text)}`);
  }
  let total = 0n;
  for (const [, num, unit] of text.matchAll(/(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/g)) {
    const [whole, frac = ''] = num.split('.');
    const scale = UNITS[unit];
    total += BigInt(whole) * scale + (BigInt(frac || '0') * scale) / 10n ** BigInt(frac.length);
  }
  return total;
}

function formatDuration(ns) {
  for (const [unit, size] of [['h', UNITS.h], ['m', UNITS.m], ['s', UNITS.s], ['ms', UNITS.ms]]) {
    if (ns >= size && ns % size === 0n) return `${ns / size}${unit}`;
  }
  return `${ns}ns`;
}

// google.protobuf.Duration as @grpc/proto-loader (longs: String) carries it.
const toProto = (ns) => ({ seconds: String(ns / 1000000000n), nanos: Number(ns % 1000000000n) });
const fromProto = (d) => (d ? BigInt(d.seconds || '0') * 1000000000n + BigInt(d.nanos || 0) : 0n);

// invalidArgument is the error for bad input: gRPC code InvalidArgument, naming the field.
function invalidArgument(field, message) {
  return { code: grpc.status.INVALID_ARGUMENT, details: `${field}: ${message}` };
}

// The policy in force. Configure replaces it whole; a refused document leaves it as it was.
let policy = { delay: 250n * UNITS.ms, maxAttempts: 0, invalidAttempts: 3 };

function parsePolicy(buf) {
  let doc;
  try {
    doc = YAML.parse(Buffer.from(buf || []).toString('utf8'));
  } catch (e) {
    throw invalidArgument('document', `not YAML or JSON: ${e.message.split('\n')[0]}`);
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) {
    throw invalidArgument('document', 'want a mapping such as "delay: 250ms"');
  }
  const next = { ...policy };
  for (const [key, value] of Object.entries(doc)) {
    switch (key) {
      case 'delay':
        try {
          next.delay = parseDuration(value);
        } catch (e) {
          throw invalidArgument('delay', e.message);
        }
        if (next.delay <= 0n) throw invalidArgument('delay', 'must be positive');
        break;
      case 'maxAttempts':
      case 'invalidAttempts':
        if (!Number.isInteger(value) || value < 0) throw invalidArgument(key, `want a whole number >= 0, got ${JSON.stringify(value)}`);
        next[key] = value;
        break;
      default:
        throw invalidArgument(key, 'unknown field (known: delay, maxAttempts, invalidAttempts)');
    }
  }
  return next;
}

const retryForcer = {
  Describe(_call, callback) {
    callback(null, {
      name: NAME, version: VERSION, capabilities: ['max-attempts'],
      max_delay: toProto(policy.delay), min_delay: toProto(policy.delay), sample_config: SAMPLE_CONFIG,
    });
  },

  Configure(call, callback) {
    try {
      policy = parsePolicy(call.request.document);
    } catch (err) {
      callback(err);
      return;
    }
    const text = `fixed ${formatDuration(policy.delay)}, maxAttempts ${policy.maxAttempts}`;
    log('info', 'policy configured', { policy: text });
    callback(null, { policy: text });
  },

  // Schedule answers from the request alone: the host keeps the state (round, attempts).
  Schedule(call, callback) {
    const req = call.request;
    const p = policy;
    if (p.maxAttempts > 0 && req.round >= p.maxAttempts) {
      callback(null, { give_up: true, reason: `max attempts ${p.maxAttempts} reached` });
      return;
    }
    const hold = [];
    let names = 0;
    for (const kind of req.failing || []) {
      names += (kind.rejected_names || []).length;
      for (const r of kind.rejected || []) {
        // cause_attempts: INVALID NACKs in a row (0 from a host that predates it: attempts).
        const invalid = Number(r.cause_attempts) || Number(r.attempts);
        if (p.invalidAttempts > 0 && r.cause === 'CAUSE_INVALID' && invalid >= p.invalidAttempts) {
          hold.push({ kind: kind.kind, name: r.name, reason: `refused as invalid ${invalid} times` });
        }
      }
    }
    if (names > 0 && hold.length === names) {
      // Every rejected name is parked: no round follows, so no delay.
      callback(null, { reason: `${hold.length} INVALID parked`, hold });
      return;
    }
    // The host's maximum (--retry-max-delay) comes in every request; cap the delay there.
    const hostMax = fromProto(req.max_delay);
    const delay = hostMax > 0n && p.delay > hostMax ? hostMax : p.delay;
    callback(null, { delay: toProto(delay), reason: `fixed ${formatDuration(delay)}`, hold });
  },
};

function loadServices() {
  const options = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
  const repoProto = path.join(__dirname, '..', '..', '..', 'proto');
  const ownProto = path.join(__dirname, 'proto');
  const pkg = (file, dirs) => grpc.loadPackageDefinition(protoLoader.loadSync(file, { ...options, includeDirs: dirs }));
  return {
    retry: pkg('plugin/v1/plugin.proto', [repoProto]).plugin.v1.RetryForcer.service,
    health: pkg('grpc/health/v1/health.proto', [ownProto]).grpc.health.v1.Health.service,
    controller: pkg('plugin/grpc_controller.proto', [ownProto]).plugin.GRPCController.service,
  };
}

// Protocol §3: AutoMTLS. A self-signed certificate for "localhost" that the host trusts once it
// reads its DER in the handshake line, and the host's certificate as the only client CA.
function selfSignedCertificate() {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(publicKey.export({ type: 'spki', format: 'pem' }));
  cert.serialNumber = '01' + crypto.randomBytes(15).toString('hex');
  cert.validity.notBefore = new Date(Date.now() - 30 * 1000);
  cert.validity.notAfter = new Date(Date.now() + 365 * 24 * 3600 * 1000);
  const subject = [{ name: 'commonName', value: 'localhost' }, { name: 'organizationName', value: NAME }];
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, keyCertSign: true, critical: true },
    { name: 'extKeyUsage', serverAuth: true, clientAuth: true },
    { name: 'subjectAltName', altNames: [{ type: 2, value: 'localhost' }] },
  ]);
  const key = privateKey.export({ type: 'pkcs8', format: 'pem' });
  cert.sign(forge.pki.privateKeyFromPem(key), forge.md.sha256.create());
  const der = Buffer.from(forge.asn1.toDer(forge.pki.certificateToAsn1(cert)).getBytes(), 'binary');
  return { certPem: Buffer.from(forge.pki.certificateToPem(cert)), keyPem: Buffer.from(key), der };
}

function main() {
  // Protocol §1: run by hand, without the cookie, a plugin says so and exits 1.
  if (process.env[COOKIE_KEY] !== COOKIE_VALUE) {
    process.stderr.write('This binary is a plugin. These are not meant to be executed directly.\n' +
      'Please execute the program that consumes these plugins, which will\nload any plugins automatically\n');
    process.exit(1);
  }
  // Protocol §2: the host lists the versions it speaks; answer with the one you serve even when
  // it is not listed, and the host refuses it with a version error.
  const offered = (process.env.PLUGIN_PROTOCOL_VERSIONS || '').split(',').map(Number);
  if (!offered.includes(APP_PROTOCOL)) {
    log('warn', 'the host offers no protocol version this plugin serves', { offered: process.env.PLUGIN_PROTOCOL_VERSIONS, served: APP_PROTOCOL });
  }
  const hostCert = process.env.PLUGIN_CLIENT_CERT;
  if (!hostCert) {
    log('error', 'PLUGIN_CLIENT_CERT is not set: kds-host always uses AutoMTLS');
    process.exit(1);
  }

  const services = loadServices();
  const server = new grpc.Server();
  server.addService(services.retry, retryForcer);
  server.addService(services.health, {
    Check(_call, callback) {
      callback(null, { status: 'SERVING' });
    },
  });
  server.addService(services.controller, {
    // Protocol §5: the host is done. Answer, stop serving, exit.
    Shutdown(_call, callback) {
      log('debug', 'shutdown requested by the host');
      callback(null, {});
      setImmediate(() => server.tryShutdown(() => process.exit(0)));
      setTimeout(() => process.exit(0), 500).unref();
    },
  });

  const { certPem, keyPem, der } = selfSignedCertificate();
  const creds = grpc.ServerCredentials.createSsl(Buffer.from(hostCert), [{ private_key: keyPem, cert_chain: certPem }], true);

  // Protocol §2: a unix socket in PLUGIN_UNIX_SOCKET_DIR (else the temporary folder), as Go
  // plugins do; 127.0.0.1 with a port in [PLUGIN_MIN_PORT, PLUGIN_MAX_PORT] works as well.
  const dir = fs.mkdtempSync(path.join(process.env.PLUGIN_UNIX_SOCKET_DIR || os.tmpdir(), 'node-retry-'));
  const socket = path.join(dir, 'plugin.sock');
  const cleanup = () => fs.rmSync(dir, { recursive: true, force: true });
  process.on('exit', cleanup);
  // The host's Ctrl-C reaches the whole process group: ignore SIGINT as go-plugin does, and
  // leave when the host says so (Shutdown) or ends us (SIGTERM, SIGKILL).
  process.on('SIGINT', () => log('trace', 'interrupt ignored'));
  process.on('SIGTERM', () => process.exit(0));

  server.bindAsync('unix:' + socket, creds, (err) => {
    if (err) {
      log('error', 'cannot listen', { error: err.message });
      process.exit(1);
    }
    // Protocol §2: the handshake line. CORE|APP|NETWORK|ADDRESS|PROTOCOL|CERT, the certificate
    // as base64 of its DER without padding.
    const line = [CORE_PROTOCOL, APP_PROTOCOL, 'unix', socket, 'grpc', der.toString('base64').replace(/=+$/, '')].join('|');
    process.stdout.write(line + '\n');
    log('debug', 'plugin address', { network: 'unix', address: socket });
  });
}

main();
