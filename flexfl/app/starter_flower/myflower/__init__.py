"""A Flower app with FlexFL's rules: server_app.py (FlexFLStrategy), client_app.py (DeadlineTraining), task.py (data,
model, local update). README.md beside this folder says how to run and edit it."""
