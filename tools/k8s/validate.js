#!/usr/bin/env node
'use strict';
// Usage: node tools/k8s/validate.js PATH...
//
// Checks every YAML document of each file (a directory: its *.yaml and
// *.yml files) against the Kubernetes API schema of its apiVersion and
// kind (kubernetes-models, pinned in package-lock.json), as strictly as
// the API server's strict field validation: wrong types, missing required
// fields, values outside an enum and unknown fields are errors, and so is
// an apiVersion/kind with no schema. A kustomization.yaml is checked
// against the directory it sits in: it lists every manifest of the
// directory except the examples (*.example.yaml), and only files that
// exist.
//
// Prints one line per error, "FILE:LINE: document N (KIND NAME): PATH:
// message", and exits 1 if there is any; 0 and a summary otherwise.

const fs = require('fs');
const path = require('path');
const { expandPaths, loadFiles, schemaErrors } = require('./manifests.js');

// The keys of a kustomization this directory may use.
const KUSTOMIZATION_KEYS = new Set([
  'apiVersion', 'kind', 'resources', 'namespace', 'namePrefix', 'nameSuffix',
  'labels', 'commonLabels', 'commonAnnotations', 'images', 'patches',
  'replicas', 'components', 'configMapGenerator', 'secretGenerator',
  'generatorOptions',
]);

function kustomizationErrors(m) {
  const v = m.value;
  const dir = path.dirname(m.file);
  const out = [];
  if (v.apiVersion !== 'kustomize.config.k8s.io/v1beta1') {
    out.push({ pointer: '/apiVersion', message: 'must be kustomize.config.k8s.io/v1beta1' });
  }
  for (const k of Object.keys(v)) {
    if (!KUSTOMIZATION_KEYS.has(k)) out.push({ pointer: `/${k}`, message: `unknown field "${k}"` });
  }
  const resources = Array.isArray(v.resources) ? v.resources : [];
  if (!Array.isArray(v.resources)) {
    out.push({ pointer: '/resources', message: 'must be a list of files' });
  }
  resources.forEach((r, i) => {
    if (typeof r !== 'string' || !fs.existsSync(path.join(dir, r))) {
      out.push({ pointer: `/resources/${i}`, message: `no such file: ${r}` });
    } else if (/\.example\.ya?ml$/.test(r)) {
      out.push({ pointer: `/resources/${i}`, message: `${r} is an example: apply it by hand` });
    }
  });
  for (const name of fs.readdirSync(dir).sort()) {
    if (!/\.ya?ml$/.test(name) || /\.example\.ya?ml$/.test(name)) continue;
    if (name === path.basename(m.file) || resources.includes(name)) continue;
    out.push({ pointer: '/resources', message: `does not list ${name}` });
  }
  return out;
}

function main(argv) {
  if (argv.length === 0) {
    process.stderr.write('usage: node tools/k8s/validate.js PATH...\n');
    return 2;
  }
  const files = expandPaths(argv);
  const { manifests, errors } = loadFiles(files);
  const lines = [...errors];
  for (const m of manifests) {
    const isKustomization =
      m.value && m.value.kind === 'Kustomization' && path.basename(m.file) === 'kustomization.yaml';
    const errs = isKustomization ? kustomizationErrors(m) : schemaErrors(m);
    for (const e of errs) {
      lines.push(m.error(e.pointer, e.message));
    }
  }
  if (lines.length) {
    for (const l of lines) process.stderr.write(`${l}\n`);
    process.stderr.write(`validate.js: ${lines.length} error(s)\n`);
    return 1;
  }
  process.stdout.write(
    `validate.js: ${manifests.length} document(s) in ${files.length} file(s) match the Kubernetes API schemas\n`,
  );
  return 0;
}

process.exitCode = main(process.argv.slice(2));
