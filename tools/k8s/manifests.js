'use strict';
// Reading Kubernetes manifests and checking them against the Kubernetes API
// schemas (the kubernetes-models package: JSON schemas generated from the
// Kubernetes OpenAPI document, compiled with ajv). Used by validate.js and
// check_relays.js.

const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

// One parsed YAML document of a manifest file.
//   file: the path as given; index: 1-based position in the file;
//   value: the plain JS value; doc: the yaml Document (for line numbers).
class Manifest {
  constructor(file, index, value, doc, lines) {
    this.file = file;
    this.index = index;
    this.value = value;
    this.doc = doc;
    this.lines = lines;
  }

  // "document 1 (DaemonSet dcr-relay)".
  get label() {
    const v = this.value;
    const what =
      v && typeof v === 'object' && !Array.isArray(v)
        ? ` (${v.kind || '?'} ${(v.metadata && v.metadata.name) || '?'})`
        : '';
    return `document ${this.index}${what}`;
  }

  // "FILE:LINE: document N (KIND NAME): POINTER: message".
  error(pointer, message) {
    return `${this.file}:${this.lineOf(pointer)}: ${this.label}: ${pointer || '/'}: ${message}`;
  }

  // The 1-based line of a JSON pointer ("/spec/template"), or of its
  // nearest ancestor the document has; 0 when none is known.
  lineOf(pointer) {
    const keys = pointer
      .split('/')
      .slice(1)
      .map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'));
    for (let n = keys.length; n >= 0; n--) {
      const node = this.doc.getIn(
        keys.slice(0, n).map((k) => (/^\d+$/.test(k) ? Number(k) : k)),
        true,
      );
      if (node && node.range) return this.lines.linePos(node.range[0]).line;
    }
    return 0;
  }
}

// The YAML files of a directory (not its subdirectories), sorted; a file
// argument is taken as it is.
function expandPaths(paths) {
  const files = [];
  for (const p of paths) {
    if (fs.statSync(p).isDirectory()) {
      for (const name of fs.readdirSync(p).sort()) {
        if (/\.ya?ml$/.test(name)) files.push(path.join(p, name));
      }
    } else {
      files.push(p);
    }
  }
  return files;
}

// Values that YAML 1.1 (octal 0400, yes/no/on/off booleans, sexagesimal
// numbers) and YAML 1.2 read differently: a manifest holding one means
// different things to different tools. Returns the pointers where they
// differ.
function versionDifferences(a, b, pointer = '', out = []) {
  if (a === b) return out;
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    for (const k of keys) {
      versionDifferences(a[k], b[k], `${pointer}/${k}`, out);
    }
    return out;
  }
  out.push(pointer || '/');
  return out;
}

// Parses every file; returns {manifests, errors}. Each error is a line of
// text naming the file and line.
function loadFiles(files) {
  const manifests = [];
  const errors = [];
  for (const file of files) {
    const text = fs.readFileSync(file, 'utf8');
    const lines = new YAML.LineCounter();
    const docs = YAML.parseAllDocuments(text, {
      version: '1.1',
      lineCounter: lines,
      uniqueKeys: true,
      prettyErrors: false,
    });
    const docs12 = YAML.parseAllDocuments(text, { version: '1.2' });
    let index = 0;
    docs.forEach((doc, i) => {
      for (const e of [...doc.errors, ...doc.warnings]) {
        const line = e.pos ? lines.linePos(e.pos[0]).line : 0;
        errors.push(`${file}:${line}: ${e.message.split('\n')[0]}`);
      }
      if (doc.errors.length) return;
      const value = doc.toJS();
      if (value === null || value === undefined) return; // comments only
      index++;
      const m = new Manifest(file, index, value, doc, lines);
      const other = docs12[i] && !docs12[i].errors.length ? docs12[i].toJS() : null;
      for (const p of versionDifferences(value, other)) {
        errors.push(
          m.error(
            p,
            'YAML 1.1 and 1.2 read this value differently (an octal 0400, ' +
              'a yes/no, a 1:30): write it so that both read the same ' +
              '(256, "yes", true)',
          ),
        );
      }
      manifests.push(m);
    });
  }
  return { manifests, errors };
}

// The kubernetes-models class for an apiVersion and kind, or null.
function modelClass(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') return null;
  if (!/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion)) return null;
  let mod;
  try {
    mod = require(`kubernetes-models/${apiVersion}`);
  } catch (e) {
    if (e.code === 'MODULE_NOT_FOUND' || e.code === 'ERR_PACKAGE_PATH_NOT_EXPORTED') {
      return null;
    }
    throw e;
  }
  const cls = Object.prototype.hasOwnProperty.call(mod, kind) ? mod[kind] : null;
  return typeof cls === 'function' && typeof cls.prototype.validate === 'function'
    ? cls
    : null;
}

// A deep copy of value in which every object is a Proxy that records the
// keys read from it, and the list of those objects with their pointers.
// The generated validators read each property the schema declares (and
// every key of a map they check, such as labels or data), so a key that
// nothing read is one the schema does not know: the API server's strict
// field validation (kubectl's default) rejects it, and the schema alone
// would not.
function tracked(value, pointer, seen) {
  if (value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) {
    return value.map((v, i) => tracked(v, `${pointer}/${i}`, seen));
  }
  const read = new Set();
  const copy = {};
  for (const [k, v] of Object.entries(value)) {
    copy[k] = tracked(v, `${pointer}/${k.replace(/~/g, '~0').replace(/\//g, '~1')}`, seen);
  }
  seen.push({ pointer, keys: Object.keys(copy), read });
  return new Proxy(copy, {
    get(target, key, receiver) {
      if (typeof key === 'string') read.add(key);
      return Reflect.get(target, key, receiver);
    },
    has(target, key) {
      if (typeof key === 'string') read.add(key);
      return Reflect.has(target, key);
    },
  });
}

// Checks one manifest against its Kubernetes API schema. Returns a list
// of {pointer, message}; empty when it is valid.
function schemaErrors(m) {
  const v = m.value;
  if (!v || typeof v !== 'object' || Array.isArray(v)) {
    return [{ pointer: '', message: 'a manifest must be a mapping' }];
  }
  const cls = modelClass(v.apiVersion, v.kind);
  if (!cls) {
    return [
      {
        pointer: '/kind',
        message: `no Kubernetes API schema for apiVersion ${JSON.stringify(v.apiVersion)}, kind ${JSON.stringify(v.kind)}`,
      },
    ];
  }
  const seen = [];
  const proxy = tracked(v, '', seen);
  try {
    // kubernetes-models' validate() runs the schema's compiled validator
    // on `this` and throws ajv's ValidationError.
    cls.prototype.validate.call(proxy);
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    return e.errors.map((err) => ({
      pointer: err.instancePath,
      message:
        err.message +
        (err.params && err.params.allowedValues
          ? ` (${err.params.allowedValues.join(', ')})`
          : ''),
    }));
  }
  const out = [];
  for (const o of seen) {
    for (const k of o.keys) {
      if (!o.read.has(k)) {
        out.push({
          pointer: `${o.pointer}/${k}`,
          message: `unknown field "${k}"`,
        });
      }
    }
  }
  if (!v.metadata || typeof v.metadata.name !== 'string' || !v.metadata.name) {
    out.push({ pointer: '/metadata', message: 'must have a name' });
  }
  return out;
}

module.exports = { Manifest, expandPaths, loadFiles, modelClass, schemaErrors };
