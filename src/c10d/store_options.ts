/**
 * What `StoreClient.connect` takes: the session, its secrets, the timeouts, and the Node-only
 * TLS and pulse settings. Its own module so that the socket code and the client share it.
 */
export interface StoreClientOptions {
  /** The session (namespace) to use. */
  session: string;
  /**
   * The session's secret (`newSessionToken()`; a share link's `#token=...`). The connection that
   * creates the session fixes it; every later one must present the same, or `connect` fails with
   * `UnauthorizedError`. Only the server's host creates sessions: a connection from the server's
   * own machine, one with `admin`, or the server's own `createSession` (the launcher's way);
   * anyone else naming a session that does not exist gets `UnauthorizedError`.
   */
  token: string;
  /** The server's admin secret (`RunningServer.adminSecret`): lets a connection from another machine create the session. */
  admin?: string;
  /**
   * The session's host secret (same format as a token). The connection that creates the session
   * fixes it; a later one presenting it becomes the host (`isHost`) and may send `control`; a
   * wrong one fails `connect` with `UnauthorizedError`. Ignored by a session created without one.
   */
  host?: string;
  /** Default timeout of blocking calls. Default 300 s, as torch. */
  timeoutMs?: number;
  /** How long to wait for the socket to open and the server to answer `hello`. Default 10 s. */
  connectTimeoutMs?: number;
  /** How long a non-blocking request may go unanswered before it fails. Default 30 s. */
  requestTimeoutMs?: number;
  /**
   * How long a store request refused with STORE_UNAVAILABLE (the server's shared store, a Redis,
   * does not answer) is tried again, with backoff, before the refusal is the caller's; `on('store')`
   * hears the store go and come back. Only requests that may be repeated safely (not `add`,
   * `append`, `deleteKey`): store_unavailable.ts. Default 30 s; 0: never.
   */
  storeUnavailableRetryMs?: number;
  /**
   * How often to renew TURN credentials the server minted for this session (`iceServers`), so
   * that links formed hours into a run still get valid ones. Default 30 min; 0: never.
   */
  iceRenewMs?: number;
  /**
   * Node only: the certificate(s), PEM, to trust for a wss:// server whose certificate no CA of
   * Node's signed, e.g. the self-signed `certs/cert.pem` of `npm start -- --https`
   * (NODE_EXTRA_CA_CERTS=FILE does the same for a whole process). A browser trusts what its own
   * certificate store trusts and cannot take this.
   */
  ca?: string | Uint8Array | ReadonlyArray<string | Uint8Array>;
  /**
   * Once a member, beat from a Worker on a second socket (src/c10d/pulse.ts), so that a page whose
   * thread is busy is not evicted as frozen. Default: on where a browser Worker exists, off in Node
   * (where it takes a worker thread).
   */
  pulse?: boolean;
}
