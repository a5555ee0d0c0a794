/** Small helpers shared by the client's parts. */

/** The reason an aborted `signal` gives (an `AbortError` when it named none). */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("The operation was aborted.", "AbortError");
}

/** Throws `signal`'s reason if it is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortReason(signal);
}

/** Waits `ms` milliseconds; rejects with the signal's reason as soon as `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortReason(signal));
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortReason(signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * An exponential backoff with jitter for the `attempt`-th retry (0-based) when the answer named
 * no `Retry-After`: half of 500 ms · 2^attempt (at most 8 s), plus up to as much again.
 */
export function backoff(attempt: number): number {
  const ceiling = Math.min(8000, 500 * 2 ** attempt);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

/** A monotonic clock in milliseconds. */
export function now(): number {
  return globalThis.performance?.now() ?? Date.now();
}

/**
 * A random UUID (v4): `crypto.randomUUID` where the context has it (Node, secure browser
 * contexts), else built from `crypto.getRandomValues` (a page served over plain http).
 */
export function randomUUID(): string {
  const c = globalThis.crypto;
  if (typeof c?.randomUUID === "function") return c.randomUUID();
  const bytes = new Uint8Array(16);
  c.getRandomValues(bytes);
  bytes[6] = (bytes[6]! & 0x0f) | 0x40;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  const hex = [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** One signal that aborts when any of `signals` does (`AbortSignal.any` where it exists). */
export function anySignal(signals: (AbortSignal | undefined)[]): {
  signal: AbortSignal;
  dispose: () => void;
} {
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  const controller = new AbortController();
  const listeners: [AbortSignal, () => void][] = [];
  for (const s of present) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    const listener = () => controller.abort(s.reason);
    s.addEventListener("abort", listener, { once: true });
    listeners.push([s, listener]);
  }
  return {
    signal: controller.signal,
    dispose: () => {
      for (const [s, listener] of listeners) s.removeEventListener("abort", listener);
    },
  };
}
