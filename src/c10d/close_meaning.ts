/**
 * What the server's close codes mean to a rendezvous member: the session is over, its tab left
 * or was removed, or it may join again. Apart from the handler (rendezvous.ts): one table of the
 * protocol's codes, checked exhaustively, that the handler's reconnect logic reads.
 */
import { CloseCode, type CloseCodeValue } from '../wire/protocol.ts';

/** What a closed connection means for a member: the session is over, its tab left, or it may join again. */
export function afterClose(code: number): 'ended' | 'left' | 'removed' | 'rejoin' {
  const known = code as CloseCodeValue;
  switch (known) {
    case CloseCode.SESSION_ENDED:
      return 'ended';
    case CloseCode.REMOVED:
      return 'removed';
    case CloseCode.LEFT:
      return 'left';
    case CloseCode.STALLED:
    case CloseCode.EVICTED:
    case CloseCode.SERVER_CLOSING:
    case CloseCode.MESSAGE_TOO_BIG:
    case CloseCode.TOO_MANY_ERRORS:
    case CloseCode.HELLO_TIMEOUT:
    case CloseCode.SLOW_READER:
    case CloseCode.UNAUTHORIZED: // the rejoin's hello is refused again, and that ends it (UnauthorizedError)
    case CloseCode.TOO_MANY_CONNECTIONS:
      return 'rejoin';
    default: {
      // Any other code: the socket closed or broke (1000, 1001, 1006): the server may be back soon.
      const other: never = known;
      void other;
      return 'rejoin';
    }
  }
}
