/**
 * A TCP relay between a client and a real `ptc serve` whose client-to-server direction can
 * stall: the server then reads nothing the client sends while what it sends still arrives, as
 * a server too busy to read its socket (a loaded machine) or a congested uplink makes it. The
 * bytes pass unchanged; the relay knows nothing of HTTP/2 or gRPC.
 */

import { type AddressInfo, createServer, connect as netConnect, type Socket } from "node:net";

export interface Relay {
  /** `http://127.0.0.1:PORT`: give it to the client instead of the server's address. */
  address: string;
  /** Stops reading what clients send for `ms`, then reads again. */
  stall(ms: number): void;
  close(): void;
}

/** A relay to `target` (`http://host:port`), listening on an ephemeral loopback port. */
export async function startRelay(target: string): Promise<Relay> {
  const { hostname, port } = new URL(target);
  const clients = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();
  const server = createServer((client) => {
    const upstream = netConnect(Number(port), hostname);
    client.pipe(upstream);
    upstream.pipe(client);
    clients.add(client);
    const end = () => {
      clients.delete(client);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  });
  await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
  return {
    address: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    stall(ms: number) {
      for (const client of clients) client.pause();
      const timer = setTimeout(() => {
        timers.delete(timer);
        for (const client of clients) client.resume();
      }, ms);
      timers.add(timer);
    },
    close() {
      for (const timer of timers) clearTimeout(timer);
      for (const client of clients) client.destroy();
      server.close();
    },
  };
}
