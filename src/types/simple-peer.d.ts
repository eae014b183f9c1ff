// simple-peer's prebuilt browser bundle has the same API as the package's main entry.
declare module 'simple-peer/simplepeer.min.js' {
  import SimplePeer from 'simple-peer';
  export default SimplePeer;
}
