import { LonghaulError, LonghaulNetworkError } from "./errors.js";
import { describe, type Transport } from "./http.js";
import type { Upload } from "./types.js";
import { abortReason, backoff, sleep, throwIfAborted } from "./util.js";

/** The slices a Node upload is read and counted in. */
const UPLOAD_SLICE_BYTES = 64 * 1024;

/** What an upload can send. */
export type UploadData = Blob | ArrayBuffer | ArrayBufferView | string;

/** Bytes sent so far of an upload. */
export interface UploadProgress {
  loaded: number;
  total: number;
}

/** Options of `uploads.upload`. */
export interface UploadOptions {
  /** The file's name (no slashes; it ends the `input` reference). */
  filename: string;
  /** The file's media type, e.g. `text/csv`. */
  contentType: string;
  /** Called as the body is sent (in browsers from XMLHttpRequest's upload events). */
  onProgress?: (progress: UploadProgress) => void;
  signal?: AbortSignal;
}

/** `POST /uploads`, then the presigned PUT. */
export class Uploads {
  constructor(
    private readonly transport: Transport,
    private readonly fetchInjected: boolean,
  ) {}

  /**
   * Uploads `data` as one input file and answers the `input` reference a job's params name
   * (`uploads/<owner-hash>/<id>/<filename>`). `POST /uploads` is not retried after a network
   * error (it is not idempotent); the PUT is (it is).
   */
  async upload(data: UploadData, options: UploadOptions): Promise<string> {
    const blob = toBlob(data, options.contentType);
    const { body: upload } = await this.transport.json<Upload>({
      method: "POST",
      path: "/uploads",
      body: { filename: options.filename, content_type: options.contentType, size_bytes: blob.size },
      idempotent: false,
      signal: options.signal,
    });
    await this.put(upload, blob, options);
    return upload.input;
  }

  /** Creates an upload link only (`POST /uploads`), for a caller that PUTs the file itself. */
  async create(
    file: { filename: string; contentType: string; sizeBytes: number },
    options: { signal?: AbortSignal } = {},
  ): Promise<Upload> {
    const { body } = await this.transport.json<Upload>({
      method: "POST",
      path: "/uploads",
      body: { filename: file.filename, content_type: file.contentType, size_bytes: file.sizeBytes },
      idempotent: false,
      signal: options.signal,
    });
    return body;
  }

  private async put(upload: Upload, blob: Blob, options: UploadOptions): Promise<void> {
    const { signal, onProgress } = options;
    const total = blob.size;
    const maxRetries = this.transport.options.maxRetries;
    for (let attempt = 0; ; attempt++) {
      throwIfAborted(signal);
      let status: number;
      let error: LonghaulError | undefined;
      try {
        const answer =
          onProgress && typeof XMLHttpRequest === "function" && !this.fetchInjected
            ? await xhrPut(upload, blob, onProgress, signal)
            : await this.fetchPut(upload, blob, onProgress, signal);
        status = answer.status;
        error = answer.error;
      } catch (err) {
        if (signal?.aborted) throw abortReason(signal);
        if (attempt >= maxRetries) {
          throw new LonghaulNetworkError(`PUT of the upload failed (${describe(err)})`, { cause: err });
        }
        await sleep(backoff(attempt), signal);
        continue;
      }
      if (status >= 200 && status < 300) {
        onProgress?.({ loaded: total, total });
        return;
      }
      // S3 answers 503 SlowDown (and 500) to be retried; anything else is final.
      if (![500, 503].includes(status) || attempt >= maxRetries) throw error;
      await sleep(backoff(attempt), signal);
    }
  }

  private async fetchPut(
    upload: Upload,
    blob: Blob,
    onProgress: UploadOptions["onProgress"],
    signal: AbortSignal | undefined,
  ): Promise<{ status: number; error?: LonghaulError }> {
    const total = blob.size;
    const init: RequestInit & { duplex?: "half" } = {
      method: "PUT",
      headers: { ...upload.headers },
      body: blob,
      signal,
    };
    onProgress?.({ loaded: 0, total });
    if (onProgress && isNode() && total > 0) {
      // Node's fetch sends a stream with the declared length: the bytes are counted as the
      // connection takes them, a slice at a time.
      let loaded = 0;
      init.body = new ReadableStream<Uint8Array>(
        {
          async pull(controller) {
            if (loaded >= total) {
              controller.close();
              return;
            }
            const slice = blob.slice(loaded, Math.min(total, loaded + UPLOAD_SLICE_BYTES));
            const bytes = new Uint8Array(await slice.arrayBuffer());
            loaded += bytes.byteLength;
            controller.enqueue(bytes);
            if (loaded < total) onProgress({ loaded, total });
          },
        },
        { highWaterMark: 0 },
      );
      init.duplex = "half";
      (init.headers as Record<string, string>)["content-length"] = String(total);
    }
    const response = await this.transport.options.fetch(upload.upload_url, init);
    if (response.ok) {
      await response.body?.cancel().catch(() => undefined);
      return { status: response.status };
    }
    return { status: response.status, error: await LonghaulError.fromResponse(response) };
  }
}

function isNode(): boolean {
  const process = (globalThis as { process?: { versions?: { node?: string } } }).process;
  return typeof process?.versions?.node === "string";
}

function toBlob(data: UploadData, contentType: string): Blob {
  if (data instanceof Blob) return data;
  if (typeof data === "string") return new Blob([data], { type: contentType });
  if (data instanceof ArrayBuffer) return new Blob([data], { type: contentType });
  const view = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return new Blob([view as Uint8Array<ArrayBuffer>], { type: contentType });
}

/** A PUT through XMLHttpRequest: the only way a browser reports an upload's progress. */
function xhrPut(
  upload: Upload,
  blob: Blob,
  onProgress: (progress: UploadProgress) => void,
  signal: AbortSignal | undefined,
): Promise<{ status: number; error?: LonghaulError }> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", upload.upload_url);
    for (const [name, value] of Object.entries(upload.headers)) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (e) => onProgress({ loaded: e.loaded, total: blob.size });
    const onAbort = () => xhr.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    xhr.onload = () => {
      signal?.removeEventListener("abort", onAbort);
      if (xhr.status >= 200 && xhr.status < 300) {
        resolve({ status: xhr.status });
        return;
      }
      const detail = (xhr.responseText || "").trim().slice(0, 500) || `HTTP ${xhr.status}`;
      resolve({
        status: xhr.status,
        error: new LonghaulError({
          type: "about:blank",
          title: xhr.statusText || "Upload refused",
          status: xhr.status,
          detail,
        }),
      });
    };
    xhr.onerror = () => {
      signal?.removeEventListener("abort", onAbort);
      reject(new TypeError("the upload could not be sent"));
    };
    xhr.onabort = () => {
      signal?.removeEventListener("abort", onAbort);
      reject(signal ? abortReason(signal) : new DOMException("aborted", "AbortError"));
    };
    onProgress({ loaded: 0, total: blob.size });
    xhr.send(blob);
  });
}
