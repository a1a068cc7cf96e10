"""Running a plan: the job's plan and schedule, the executor of a rank's actions, replicas, optimizers, meters."""
