/**
 * `wire`: what travels between tabs and the server: the protocol's codes and limits, and the
 * 16-bit and int8 encodings of float32 values (a collective's `wire`, a pipeline's activations).
 */
export {
  ErrorCode,
  CloseCode,
  DEFAULT_LIMITS,
  PROTOCOL_VERSION,
  type ControlAction,
  type ControlEvent,
  type HostAction,
  type TokenEvent,
} from './wire/protocol.ts';
export {
  WIRE_DTYPES,
  wireBytes,
  wirePayloadBytes,
  encode16,
  decode16,
  roundToWire,
  toFloat16Bits,
  fromFloat16Bits,
  toBfloat16Bits,
  fromBfloat16Bits,
  packHalf,
  unpackHalf,
  type HalfDtype,
} from './wire/half.ts';
export { encodeInt8, decodeInt8, int8Bytes, roundToInt8, INT8_BLOCK } from './wire/int8_wire.ts';
