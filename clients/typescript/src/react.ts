/**
 * `@longhaul/client/react`: a hook that follows a job (`jobs.wait`: its live stream, or
 * polling) and re-renders with its status and progress.
 *
 * ```tsx
 * import { LonghaulProvider, useJob } from "@longhaul/client/react";
 *
 * <LonghaulProvider client={lh}><Bar jobId={id} /></LonghaulProvider>
 *
 * function Bar({ jobId }) {
 *   const { status, progress, error } = useJob(jobId);
 *   if (error) return <p>{String(error)}</p>;
 *   return <progress max={100} value={progress?.pct ?? 0} title={status} />;
 * }
 * ```
 */
import { type ReactNode, createContext, createElement, useContext, useEffect, useState } from "react";

import type { Longhaul } from "./client.js";
import type { Job, JobStatus, ProgressUpdate } from "./types.js";

const LonghaulContext = createContext<Longhaul | null>(null);

/** Makes `client` the one `useJob` uses below it. */
export function LonghaulProvider(props: { client: Longhaul; children?: ReactNode }): ReactNode {
  return createElement(LonghaulContext.Provider, { value: props.client }, props.children);
}

/** What `useJob` answers. */
export interface JobState {
  /** The job's status (undefined until it was first read). */
  status: JobStatus | undefined;
  /** Its latest progress. */
  progress: ProgressUpdate | undefined;
  /** Its terminal view, once it ended. */
  job: Job | undefined;
  /** Why it could not be followed (a `LonghaulError`, a network error), if so. */
  error: unknown;
}

const NOTHING: JobState = { status: undefined, progress: undefined, job: undefined, error: undefined };

/**
 * Follows job `id` while the component is mounted (nothing when `id` is empty), with the
 * client of the nearest `LonghaulProvider` or `options.client`. Changing `id` or unmounting
 * aborts the follow.
 */
export function useJob(
  id: string | null | undefined,
  options: { client?: Longhaul; stream?: boolean } = {},
): JobState {
  const provided = useContext(LonghaulContext);
  const client = options.client ?? provided;
  if (!client) {
    throw new Error("useJob needs a client: wrap it in <LonghaulProvider client={…}> or pass { client }");
  }
  const stream = options.stream ?? true;
  const [state, setState] = useState<JobState>(NOTHING);
  useEffect(() => {
    setState(NOTHING);
    if (!id) return undefined;
    const controller = new AbortController();
    client.jobs
      .wait(id, {
        signal: controller.signal,
        stream,
        onProgress: (progress) => {
          if (!controller.signal.aborted) {
            setState((s) => ({ ...s, status: progress.status, progress }));
          }
        },
      })
      .then(
        (job) => {
          if (!controller.signal.aborted) setState((s) => ({ ...s, status: job.status, job }));
        },
        (error: unknown) => {
          if (!controller.signal.aborted) setState((s) => ({ ...s, error }));
        },
      );
    return () => controller.abort();
  }, [client, id, stream]);
  return state;
}
