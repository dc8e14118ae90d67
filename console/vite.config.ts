// Builds the console into dist/ for the gridlinks binary to embed (crates/gridlinks-server's
// build.rs): hashed assets under assets/, and a gzip copy of every file beside it, which the
// server sends to browsers that accept gzip.
import { defineConfig, type Plugin } from 'vite';
import { gzipSync } from 'node:zlib';
import { readdirSync, readFileSync, writeFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

function gzipped(dir: string): Plugin {
  const walk = (d: string): string[] =>
    readdirSync(d).flatMap((f) => (statSync(join(d, f)).isDirectory() ? walk(join(d, f)) : [join(d, f)]));
  return {
    name: 'gridlinks-gzip',
    apply: 'build',
    closeBundle() {
      for (const f of walk(dir).filter((f) => !f.endsWith('.gz'))) {
        writeFileSync(`${f}.gz`, gzipSync(readFileSync(f), { level: 9 }));
      }
    },
  };
}

export default defineConfig({
  base: '/',
  build: { outDir: 'dist', assetsDir: 'assets', emptyOutDir: true, target: 'es2022', sourcemap: false },
  plugins: [gzipped('dist')],
});
