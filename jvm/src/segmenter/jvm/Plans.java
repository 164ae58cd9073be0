package segmenter.jvm;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.ColumnarToRowExec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.WholeStageCodegenExec;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** A Dataset's internal rows (or column batches) in, a Dataset over rows of our own out: both lazy. */
final class Plans {
    private static final String AQE = "spark.sql.adaptive.enabled";

    private Plans() {}

    /**
     * The RDD of {@code ds}'s internal rows, planned in a clone of its session with adaptive execution
     * off: an adaptive plan runs its shuffles the moment its RDD is asked for. Our inputs shuffle to
     * partition counts they name themselves (or not at all), so there was nothing to coalesce.
     */
    static RDD<InternalRow> rows(Dataset<Row> ds) {
        return planned(ds).toRdd();
    }

    /**
     * The column batches of a one-column binary {@code ds} whose plan is a columnar scan turned into
     * rows (Parquet, ORC: a landing table), or null. Read straight from the batches, a value is a view
     * of the reader's memory; the rows of {@link #rows} are two copies of it (out of the column into an
     * array, the array into an {@code UnsafeRow}), which at 16 KiB segments were a third of the decode
     * stage's samples.
     */
    static RDD<ColumnarBatch> batches(Dataset<Row> ds) {
        SparkPlan plan = planned(ds).executedPlan();
        if (plan instanceof WholeStageCodegenExec whole) {
            plan = whole.child();
        }
        if (plan instanceof ColumnarToRowExec toRows && toRows.child().supportsColumnar()
            && toRows.child().output().size() == 1
            && toRows.child().output().head().dataType() instanceof BinaryType) {
            return toRows.child().executeColumnar();
        }
        return null;
    }

    private static org.apache.spark.sql.execution.QueryExecution planned(Dataset<Row> ds) {
        org.apache.spark.sql.classic.Dataset<Row> input = (org.apache.spark.sql.classic.Dataset<Row>) ds;
        SparkSession planner = input.sparkSession().cloneSession();
        planner.sessionState().conf().setConfString(AQE, "false");
        return org.apache.spark.sql.classic.Dataset.ofRows(planner, input.logicalPlan()).queryExecution();
    }

    /** A DataFrame of {@code ds}'s session over {@code rows} ({@code LogicalRDD}): the rest plans as usual. */
    static Dataset<Row> frame(Dataset<Row> ds, RDD<InternalRow> rows, StructType schema) {
        SparkSession session = ((org.apache.spark.sql.classic.Dataset<Row>) ds).sparkSession();
        return session.internalCreateDataFrame(rows, schema, false);
    }
}
