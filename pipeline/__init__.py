"""Everything around the model: data preparation, training and tuning on Ray, MLflow tracking, serving."""

from .launch import job_env

job_env.apply()  # in a job from `nmt submit --forward-env`: its variables, in every process of the job
