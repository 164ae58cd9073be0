package segmenter.jvm;

import org.apache.spark.TaskContext;
import org.apache.spark.util.TaskCompletionListener;

/**
 * Files a task attempt writes for a later reader (side files, stage files): named after the attempt,
 * so a retried or speculative attempt never writes into another's file, and tidied when the attempt
 * completes, whether or not it succeeded.
 */
final class TaskFiles {
    private TaskFiles() {}

    /** {@code <partition>-<attempt>-<taskAttemptId>}, or {@code local-0-0} outside a task. */
    static String attemptName() {
        TaskContext ctx = TaskContext.get();
        return ctx == null ? "local-0-0" : ctx.partitionId() + "-" + ctx.attemptNumber() + "-" + ctx.taskAttemptId();
    }

    /** {@code action} when the current task completes (nothing outside a task). */
    static void onCompletion(Runnable action) {
        TaskContext ctx = TaskContext.get();
        if (ctx != null) {
            ctx.addTaskCompletionListener(new TaskCompletionListener() {
                @Override
                public void onTaskCompletion(TaskContext context) {
                    action.run();
                }
            });
        }
    }
}
