package segmenter.jvm;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.StructType;

/** A Dataset's internal rows in, a Dataset over rows of our own out: both lazy. */
final class Plans {
    private static final String AQE = "spark.sql.adaptive.enabled";

    private Plans() {}

    /**
     * The RDD of {@code ds}'s internal rows, planned in a clone of its session with adaptive execution
     * off: an adaptive plan runs its shuffles the moment its RDD is asked for. Our inputs shuffle to
     * partition counts they name themselves (or not at all), so there was nothing to coalesce.
     */
    static RDD<InternalRow> rows(Dataset<Row> ds) {
        org.apache.spark.sql.classic.Dataset<Row> input = (org.apache.spark.sql.classic.Dataset<Row>) ds;
        SparkSession planner = input.sparkSession().cloneSession();
        planner.sessionState().conf().setConfString(AQE, "false");
        return org.apache.spark.sql.classic.Dataset.ofRows(planner, input.logicalPlan()).queryExecution().toRdd();
    }

    /** A DataFrame of {@code ds}'s session over {@code rows} ({@code LogicalRDD}): the rest plans as usual. */
    static Dataset<Row> frame(Dataset<Row> ds, RDD<InternalRow> rows, StructType schema) {
        SparkSession session = ((org.apache.spark.sql.classic.Dataset<Row>) ds).sparkSession();
        return session.internalCreateDataFrame(rows, schema, false);
    }
}
