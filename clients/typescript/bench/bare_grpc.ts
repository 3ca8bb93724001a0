/**
 * The benchmark's baseline: one unary gRPC call made by hand over `node:http2`, with nothing of
 * an SDK around it (no connect, no interceptors, no retries, no result conversion). The request
 * bytes are encoded before the clock starts and the answer is only framed, not decoded, so a
 * call's time is the server's handling plus the loopback HTTP/2 exchange, about the least any
 * client on this machine can spend; an SDK's overhead is its time minus this one's.
 */

import { type ClientHttp2Session, connect } from "node:http2";
import { connect as tcpConnect } from "node:net";

export interface BareCall {
  /** The response message's bytes. */
  message: Uint8Array;
  grpcStatus: string;
}

export class BareGrpc {
  private readonly session: ClientHttp2Session;

  constructor(address: string) {
    // Nagle off, as the SDK's transport has it: the same wire for both.
    this.session = connect(address, {
      createConnection: (url: URL) =>
        tcpConnect({ host: url.hostname, port: Number(url.port) }).setNoDelay(true),
    });
    this.session.on("error", () => undefined); // a failed call reports its own error
  }

  /** Calls `path` (`/package.Service/Method`) with the encoded `request`. */
  call(path: string, request: Uint8Array): Promise<BareCall> {
    const frame = Buffer.alloc(5 + request.byteLength);
    frame.writeUInt32BE(request.byteLength, 1);
    frame.set(request, 5);
    return new Promise((resolve, reject) => {
      const stream = this.session.request({
        ":method": "POST",
        ":path": path,
        "content-type": "application/grpc",
        te: "trailers",
      });
      const chunks: Buffer[] = [];
      let grpcStatus = "";
      stream.on("response", (headers) => {
        // A trailers-only answer (an error) carries the status in its headers.
        if (headers["grpc-status"] !== undefined) grpcStatus = String(headers["grpc-status"]);
      });
      stream.on("trailers", (trailers) => {
        grpcStatus = String(trailers["grpc-status"] ?? "");
      });
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.on("error", reject);
      stream.on("end", () => {
        const body = Buffer.concat(chunks);
        resolve({ message: body.subarray(5), grpcStatus });
      });
      stream.end(frame);
    });
  }

  close(): void {
    this.session.close();
  }
}
