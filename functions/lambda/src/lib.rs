//! **longhaul-lambda** — the one binary every function of the template deploys.
//!
//! Each function's handler lives in its own crate (`functions/<name>`, with its start-up in
//! that crate's `lambda` module); this crate links them all into one executable, and the
//! function's `LONGHAUL_FUNCTION` environment variable (set per function in `template.yaml`)
//! chooses which one runs. One binary means one release link of the SDK graph instead of one
//! per function (see BENCHMARKS.md, "Build time"), while each function keeps its own role,
//! memory, timeout and log group. Nothing starts before the choice is made: a function builds
//! only its own configuration and clients.

use std::fmt;
use std::str::FromStr;

/// The environment variable that names the function a process runs.
pub const FUNCTION_VAR: &str = "LONGHAUL_FUNCTION";

/// Every function the binary can run, named as `LONGHAUL_FUNCTION` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Function {
    /// `POST /jobs`, `POST /jobs/{id}/retry`.
    Submit,
    /// The read path of the API.
    Status,
    /// Cancels a job.
    Cancel,
    /// Presigned upload URLs.
    Uploads,
    /// The intake queue's consumer.
    Dispatcher,
    /// A job's worker: the Step Functions task that runs its stages.
    Stage,
    /// The server-sent event stream of a job's progress.
    Events,
    /// The web console.
    Console,
    /// The caller's webhook signing secrets.
    Webhooks,
    /// The outbox's reader: the job table's stream into webhook messages.
    Notifier,
    /// Gives running slots back and wakes waiting jobs.
    Slots,
    /// Delivers webhooks.
    Webhook,
    /// The `/schedules` routes.
    Schedules,
    /// The schedule queue's consumer: submits each tick's job.
    Firing,
    /// Hourly: makes every schedule's EventBridge Scheduler twin what its record says.
    ScheduleRepair,
    /// Finds zombies, stalls, timeouts and due delayed jobs.
    Reaper,
    /// Expires results.
    Expirer,
}

impl Function {
    /// Every function, in the template's order.
    pub const ALL: [Function; 17] = [
        Function::Submit,
        Function::Status,
        Function::Cancel,
        Function::Uploads,
        Function::Dispatcher,
        Function::Stage,
        Function::Events,
        Function::Console,
        Function::Webhooks,
        Function::Notifier,
        Function::Slots,
        Function::Webhook,
        Function::Schedules,
        Function::Firing,
        Function::ScheduleRepair,
        Function::Reaper,
        Function::Expirer,
    ];

    /// The name `LONGHAUL_FUNCTION` gives it (the function's crate name).
    pub fn name(self) -> &'static str {
        match self {
            Function::Submit => "submit",
            Function::Status => "status",
            Function::Cancel => "cancel",
            Function::Uploads => "uploads",
            Function::Dispatcher => "dispatcher",
            Function::Stage => "stage",
            Function::Events => "events",
            Function::Console => "console",
            Function::Webhooks => "webhooks",
            Function::Notifier => "notifier",
            Function::Slots => "slots",
            Function::Webhook => "webhook",
            Function::Schedules => "schedules",
            Function::Firing => "firing",
            Function::ScheduleRepair => "schedule_repair",
            Function::Reaper => "reaper",
            Function::Expirer => "expirer",
        }
    }

    /// The function named by `LONGHAUL_FUNCTION` in this process's environment.
    pub fn from_env() -> Result<Function, UnknownFunction> {
        std::env::var(FUNCTION_VAR).unwrap_or_default().parse()
    }

    /// Runs this function under the Lambda runtime until the runtime stops.
    pub async fn run(self) -> Result<(), lambda_runtime::Error> {
        match self {
            Function::Submit => submit::lambda::run().await,
            Function::Status => status::lambda::run().await,
            Function::Cancel => cancel::lambda::run().await,
            Function::Uploads => uploads::lambda::run().await,
            Function::Dispatcher => dispatcher::lambda::run().await,
            Function::Stage => stage::lambda::run().await,
            Function::Events => events::lambda::run().await,
            Function::Console => console::lambda::run().await,
            Function::Webhooks => webhooks::lambda::run().await,
            Function::Notifier => notifier::lambda::run().await,
            Function::Slots => slots::lambda::run().await,
            Function::Webhook => webhook::lambda::run().await,
            Function::Schedules => schedules::lambda::run().await,
            Function::Firing => schedules::lambda::run_firing().await,
            Function::ScheduleRepair => schedules::lambda::run_repair().await,
            Function::Reaper => reaper::lambda::run().await,
            Function::Expirer => expirer::lambda::run().await,
        }
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Function {
    type Err = UnknownFunction;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Function::ALL
            .into_iter()
            .find(|function| function.name() == name)
            .ok_or_else(|| UnknownFunction(name.to_owned()))
    }
}

/// `LONGHAUL_FUNCTION` is missing or names no function: the process stops at init (an init
/// error Lambda reports) rather than serving as some default function.
#[derive(Debug, thiserror::Error)]
#[error("{FUNCTION_VAR}={0:?} names no function; expected one of: {names}", names = Function::ALL.map(Function::name).join(", "))]
pub struct UnknownFunction(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_parses_from_its_name_and_nothing_else_does() {
        for function in Function::ALL {
            assert_eq!(function.name().parse::<Function>().unwrap(), function);
        }
        for wrong in ["", "Submit", "submit ", "lambda", "stages"] {
            let err = wrong.parse::<Function>().unwrap_err();
            assert!(err.to_string().contains("expected one of: submit, status"), "{err}");
        }
    }
}
