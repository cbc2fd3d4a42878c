"""What a run holds on its device and how exactly the plan predicts it: plan against run, trace
accuracy, text, image and adapter-variant memory, what a card holds beyond the tensors."""
