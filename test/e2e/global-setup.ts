import { ensureBuilt } from '../../signaling/build.ts';

/** The pages under test are the built ones, as `npm start` serves them. */
export default async function globalSetup(): Promise<void> {
  await ensureBuilt();
}
